// Host-work counter: a CPython profile function (PyEval_SetProfile) that counts, per thread, the Python function
// calls and the calls of built-in (C) functions the interpreter makes. The stubs install it on every thread that
// enters them and uninstall it while they run, so that the counts are the framework's own work between two ops.
//
// The counts must be a function of the program alone, never of the machine or of where the memory allocator put
// objects. One kind of call is not: comparisons and hashes run by container lookups (`__eq__`, `__ne__`, `__hash__`
// called from a dict or a C++ hash map probing keys whose hashes come from object addresses or thread ids). A call of
// a function with one of the names given to phantora_hc_skip_names is therefore not counted, nor anything it calls.
//
// No Python header is needed: the callback has the Py_tracefunc signature with opaque pointers; the two C-API
// functions used (PyFrame_GetCode, Py_DecRef) are found in the running interpreter, and the offset of a code
// object's co_name is measured by the stubs at start-up (clock.py).
#include <cstdint>
#include <dlfcn.h>

namespace {
struct Counts {
    long long py;      // PyTrace_CALL: a Python frame starts (a function call, a generator resumed)
    long long c;       // PyTrace_C_CALL: a built-in function is called
    long long skipping;  // frames open inside a skipped call (0: counting)
};
thread_local Counts counts = {0, 0, 0};

typedef void* (*GetCode)(void*);
typedef void (*DecRef)(void*);
GetCode get_code = nullptr;
DecRef dec_ref = nullptr;
long name_offset = -1;
void* skip_names[8] = {nullptr};
int n_skip = 0;

inline bool skipped(void* frame) {
    if (n_skip == 0 || get_code == nullptr) return false;
    void* code = get_code(frame);
    if (code == nullptr) return false;
    void* name = *reinterpret_cast<void**>(static_cast<char*>(code) + name_offset);
    dec_ref(code);
    for (int i = 0; i < n_skip; ++i) {
        if (skip_names[i] == name) return true;
    }
    return false;
}
}  // namespace

extern "C" {
__attribute__((visibility("default"))) int phantora_hc_profile(void*, void* frame, int what, void*) {
    if (what == 0) {                    // PyTrace_CALL
        if (counts.skipping) {
            ++counts.skipping;
        } else if (skipped(frame)) {
            counts.skipping = 1;
        } else {
            ++counts.py;
        }
    } else if (what == 3) {             // PyTrace_RETURN (also when a frame unwinds on an exception)
        if (counts.skipping) --counts.skipping;
    } else if (what == 4) {             // PyTrace_C_CALL
        if (!counts.skipping) ++counts.c;
    }
    return 0;
}

// Address of this thread's counters (two long longs: Python calls, C calls); stable for the thread's life.
__attribute__((visibility("default"))) long long* phantora_hc_counts() { return &counts.py; }

// Leave calls of functions named `names` (interned str objects, kept alive by the caller) out of the counts.
// `offset`: byte offset of co_name in a code object. Returns 0, or -1 where the interpreter's functions are missing.
__attribute__((visibility("default"))) int phantora_hc_skip_names(long offset, void** names, int n) {
    get_code = reinterpret_cast<GetCode>(dlsym(RTLD_DEFAULT, "PyFrame_GetCode"));
    dec_ref = reinterpret_cast<DecRef>(dlsym(RTLD_DEFAULT, "Py_DecRef"));
    if (get_code == nullptr || dec_ref == nullptr) return -1;
    name_offset = offset;
    n_skip = n < 8 ? n : 8;
    for (int i = 0; i < n_skip; ++i) skip_names[i] = names[i];
    return 0;
}
}
