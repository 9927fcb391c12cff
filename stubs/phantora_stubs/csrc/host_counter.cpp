// Host-work counter: counts, per thread, the Python function calls, the calls of built-in (C) functions and the
// Python lines the interpreter runs. Two CPython hooks with the Py_tracefunc signature: a profile function
// (PyEval_SetProfile: calls, built-in calls, returns) and a trace function (PyEval_SetTrace: line events). The stubs
// switch both on (phantora_hc_on) on every thread that enters them and off (phantora_hc_off) while they run, so that
// the counts are the framework's own work between two ops.
//
// The counts must be a function of the program alone, never of the machine or of where the memory allocator put
// objects. One kind of call is not: comparisons and hashes run by container lookups (`__eq__`, `__ne__`, `__hash__`
// called from a dict or a C++ hash map probing keys whose hashes come from object addresses or thread ids). A call of
// a function with one of the names given to phantora_hc_skip_names is therefore not counted, nor anything it calls,
// nor the lines they run.
//
// A line event is what CPython's tracing reports as one: a line starting to run, or run again after a jump back (each
// iteration of a loop). It measures how much bytecode the framework runs, which a count of calls cannot tell: a call
// of a heavy function and one of a light function count one each.
//
// A garbage collection runs at a moment that depends on every thread's allocations, the stubs' included, so what it
// runs (finalizers, weak-reference callbacks) must not be counted, whatever the thread was doing when it started:
// framework code (counting on), the stubs (off), or the few instructions between the two as the stubs switch.
// phantora_hc_gc_pause / phantora_hc_gc_resume, called by the stubs' gc callback (itself a skipped name), switch
// both hooks off for the collection and then restore exactly the state they found.
//
// No Python header is needed: the callbacks have the Py_tracefunc signature with opaque pointers; the C-API functions
// used (PyFrame_GetCode, Py_DecRef, PyEval_SetProfile, PyEval_SetTrace) are found in the running interpreter, and
// the offset of a code object's co_name is measured by the stubs at start-up (clock.py). phantora_hc_on/off must be
// called with the GIL held (ctypes.PyDLL).
#include <cstdint>
#include <dlfcn.h>

namespace {
struct Counts {
    long long py;        // PyTrace_CALL: a Python frame starts (a function call, a generator resumed)
    long long c;         // PyTrace_C_CALL: a built-in function is called
    long long lines;     // PyTrace_LINE: a Python line runs
    long long skipping;  // frames open inside a skipped call (0: counting)
};
thread_local Counts counts = {0, 0, 0, 0};
thread_local int hooks_on = -1;      // -1: off; otherwise on, with line events (1) or without (0)
thread_local int before_gc = -1;     // hooks_on when the running collection started

typedef void* (*GetCode)(void*);
typedef void (*DecRef)(void*);
typedef int (*TraceFunc)(void*, void*, int, void*);
typedef void (*SetHook)(TraceFunc, void*);
GetCode get_code = nullptr;
DecRef dec_ref = nullptr;
SetHook set_profile = nullptr;
SetHook set_trace = nullptr;
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

// The trace function: line events only (calls and returns are the profile function's, which keeps `skipping`).
__attribute__((visibility("default"))) int phantora_hc_trace(void*, void*, int what, void*) {
    if (what == 2 && !counts.skipping) ++counts.lines;    // PyTrace_LINE
    return 0;
}

// Address of this thread's counters (three long longs: Python calls, C calls, lines); stable for the thread's life.
__attribute__((visibility("default"))) long long* phantora_hc_counts() { return &counts.py; }

// Counting on / off on the calling thread (GIL held). Returns 0, or -1 where the interpreter's functions are missing.
// `lines` 0 leaves the trace function off (no line events: calls only, as cheap as a profile function).
__attribute__((visibility("default"))) int phantora_hc_on(int lines) {
    if (set_profile == nullptr || set_trace == nullptr) return -1;
    set_profile(phantora_hc_profile, nullptr);
    if (lines) set_trace(phantora_hc_trace, nullptr);
    hooks_on = lines ? 1 : 0;
    return 0;
}

__attribute__((visibility("default"))) int phantora_hc_off() {
    if (set_profile == nullptr || set_trace == nullptr) return -1;
    set_profile(nullptr, nullptr);
    set_trace(nullptr, nullptr);
    hooks_on = -1;
    return 0;
}

// A garbage collection starts on the calling thread: counting off, the state before it kept.
__attribute__((visibility("default"))) int phantora_hc_gc_pause() {
    if (set_profile == nullptr || set_trace == nullptr) return -1;
    before_gc = hooks_on;
    if (hooks_on >= 0) phantora_hc_off();
    return 0;
}

// The collection is over: counting as it was when it started.
__attribute__((visibility("default"))) int phantora_hc_gc_resume() {
    if (set_profile == nullptr || set_trace == nullptr) return -1;
    int state = before_gc;
    before_gc = -1;
    if (state >= 0) return phantora_hc_on(state);
    if (hooks_on >= 0) phantora_hc_off();     // switched on during the collection: off, as it was
    return 0;
}

// Leave calls of functions named `names` (interned str objects, kept alive by the caller) out of the counts, and
// find the interpreter's functions. `offset`: byte offset of co_name in a code object. Returns 0, or -1 where the
// interpreter's functions are missing.
__attribute__((visibility("default"))) int phantora_hc_skip_names(long offset, void** names, int n) {
    get_code = reinterpret_cast<GetCode>(dlsym(RTLD_DEFAULT, "PyFrame_GetCode"));
    dec_ref = reinterpret_cast<DecRef>(dlsym(RTLD_DEFAULT, "Py_DecRef"));
    set_profile = reinterpret_cast<SetHook>(dlsym(RTLD_DEFAULT, "PyEval_SetProfile"));
    set_trace = reinterpret_cast<SetHook>(dlsym(RTLD_DEFAULT, "PyEval_SetTrace"));
    if (get_code == nullptr || dec_ref == nullptr || set_profile == nullptr || set_trace == nullptr) return -1;
    name_offset = offset;
    n_skip = n < 8 ? n : 8;
    for (int i = 0; i < n_skip; ++i) skip_names[i] = names[i];
    return 0;
}
}
