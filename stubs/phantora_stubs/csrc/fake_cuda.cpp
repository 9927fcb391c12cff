// Fake CUDA device support for a CPU-only build of PyTorch.
//
// Loaded with ctypes (RTLD_GLOBAL) before `import torch` on a CPU-only build. It registers
//  * a no-op c10::impl::DeviceGuardImplInterface for DeviceType::CUDA (only if none is registered), which keeps
//    the current device and the current stream per device per thread, hands out stream ids, and treats events,
//    synchronisation and queries as no-ops (the Python stubs turn them into simulator ops);
//  * an at::CUDAHooksInterface ("CUDAHooks") saying CUDA is built and available, answering the device count from
//    the environment variable PHANTORA_LOCAL_DEVICES (default 8) and the current device from the guard.
// No GPU memory is ever touched: tensors on the fake device are fake tensors (storage on the meta device).
// On a CUDA build of torch it is loaded the same way (unless PHANTORA_FAKE_CUDA=cpu-only): its hooks then take
// precedence over the real ones, and phantora_force_guard() (called after the import) replaces the real CUDA device
// guard, so the rank never touches the real GPU and every simulated device index works.
//
// The C functions at the end let Python read and set the same per-thread state.

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace {

constexpr int kMaxDevices = 256;

thread_local c10::DeviceIndex t_device = 0;
thread_local int64_t t_stream[kMaxDevices] = {0};   // current stream id per device; 0 is the default stream
std::atomic<int64_t> g_next_stream{1};
std::atomic<int64_t> g_next_event{1};

// Events, waits, synchronisations and queries that reach the guard (torch.Event, torch.Stream's methods, the
// autograd engine's cross-stream synchronisation) go to the stubs through this callback, which turns them into
// simulator ops (cuda_guard_events.py): what (an EventCall), the event, the stream, its device, and an out value
// (an elapsed time). It returns 0, or 1/0 for a query, or a negative EventError. Unset: no-ops, as before the stubs
// install it.
enum EventCall { kRecord = 0, kBlock = 1, kSyncEvent = 2, kSyncStream = 3, kElapsed = 4, kQueryEvent = 5,
                 kQueryStream = 6, kDestroy = 7 };
enum EventError { kNotReady = -1, kNotRecorded = -2, kFailed = -3 };
typedef int (*EventCallback)(int what, int64_t event, int64_t stream, int64_t device, double* out);
std::atomic<EventCallback> g_event_cb{nullptr};

int event_call(int what, void* event, const c10::Stream* stream, double* out = nullptr) {
  EventCallback cb = g_event_cb.load();
  if (cb == nullptr) return what == kQueryEvent || what == kQueryStream ? 1 : 0;
  int rc = cb(what, static_cast<int64_t>(reinterpret_cast<intptr_t>(event)), stream ? stream->id() : 0,
              stream ? stream->device_index() : 0, out);
  TORCH_CHECK(rc != kNotReady, "CUDA error: device not ready (an event of elapsed_time has not completed: "
              "synchronize on it first)");
  TORCH_CHECK(rc != kNotRecorded, "Both events must be recorded before calculating elapsed time.");
  TORCH_CHECK(rc != kFailed, "phantora: the simulation of a CUDA event or stream call failed (see the message above)");
  return rc;
}

c10::DeviceIndex device_count() {
  static const c10::DeviceIndex count = [] {
    const char* env = std::getenv("PHANTORA_LOCAL_DEVICES");
    long n = env ? std::strtol(env, nullptr, 10) : 8;
    if (n < 1) n = 1;
    if (n > kMaxDevices - 1) n = kMaxDevices - 1;
    return static_cast<c10::DeviceIndex>(n);
  }();
  return count;
}

c10::DeviceIndex clamp_index(c10::DeviceIndex d) {
  return (d < 0 || d >= kMaxDevices) ? t_device : d;
}

struct FakeCUDAGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::CUDA; }

  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old(c10::DeviceType::CUDA, t_device);
    if (d.index() >= 0) t_device = d.index();
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::CUDA, t_device); }
  void setDevice(c10::Device d) const override {
    if (d.index() >= 0) t_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) t_device = d.index();
  }

  c10::Stream make(c10::DeviceIndex d, int64_t id) const {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, d), id);
  }
  c10::Stream getStream(c10::Device d) const override {
    auto i = clamp_index(d.index());
    return make(i, t_stream[i]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return make(clamp_index(d.index()), 0); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return make(clamp_index(d.index()), g_next_stream.fetch_add(1));
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return make(clamp_index(d.index()), g_next_stream.fetch_add(1));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto i = clamp_index(s.device_index());
    auto old = make(i, t_stream[i]);
    t_stream[i] = s.id();
    return old;
  }
  void* getStreamNativeHandle(const c10::Stream s) const override {
    return reinterpret_cast<void*>(static_cast<intptr_t>(s.id()));
  }

  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    if (event == nullptr) return;
    try {
      event_call(kDestroy, event, nullptr);
    } catch (...) {
    }
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag /*flag*/) const override {
    if (*event == nullptr) *event = reinterpret_cast<void*>(static_cast<intptr_t>(g_next_event.fetch_add(1)));
    event_call(kRecord, *event, &stream);
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event != nullptr) event_call(kBlock, event, &stream);
  }
  bool queryEvent(void* event) const override { return event == nullptr || event_call(kQueryEvent, event, nullptr) > 0; }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }
  c10::DeviceCapability getDeviceCapability(c10::Device /*d*/) const override { return c10::DeviceCapability(); }
  bool queryStream(const c10::Stream& stream) const override { return event_call(kQueryStream, nullptr, &stream) > 0; }
  void synchronizeStream(const c10::Stream& stream) const override { event_call(kSyncStream, nullptr, &stream); }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) event_call(kSyncEvent, event, nullptr);
  }
  void synchronizeDevice(const c10::DeviceIndex /*device_index*/) const override {}
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const c10::Stream& /*stream*/) const override {}
  double elapsedTime(void* e1, void* e2, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(e1 != nullptr && e2 != nullptr, "Both events must be recorded before calculating elapsed time.");
    double out[2] = {static_cast<double>(reinterpret_cast<intptr_t>(e2)), 0.0};
    event_call(kElapsed, e1, nullptr, out);
    return out[1];
  }
};

struct FakeCUDAHooks final : public at::CUDAHooksInterface {
  explicit FakeCUDAHooks(at::CUDAHooksArgs) {}

  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasCUDA() const override { return true; }
  bool hasCUDART() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override { return true; }

  c10::DeviceIndex deviceCount() const override { return device_count(); }
  int getNumGPUs() const override { return device_count(); }
  c10::DeviceIndex current_device() const override { return t_device; }
  c10::DeviceIndex getCurrentDevice() const override { return t_device; }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    if (d >= 0) t_device = d;
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = t_device;
    if (d >= 0) t_device = d;
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex /*device_index*/) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Generator getNewGenerator(c10::DeviceIndex /*device_index*/) const override {
    return at::detail::createCPUGenerator();
  }
  c10::Device getDeviceFromPtr(void* /*data*/) const override { return c10::Device(c10::DeviceType::CUDA, t_device); }
  bool isPinnedPtr(const void* /*data*/) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  void deviceSynchronize(c10::DeviceIndex /*device_index*/) const override {}
};

bool g_guard_installed = false;
bool g_hooks_installed = false;

const FakeCUDAGuardImpl* guard_impl() {
  static const FakeCUDAGuardImpl* impl = new FakeCUDAGuardImpl();   // leaked: the registry is non-owning
  return impl;
}

struct Installer {
  Installer() {
    if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
      c10::impl::registerDeviceGuard(c10::DeviceType::CUDA, guard_impl());
      g_guard_installed = true;
    }
    auto* registry = at::CUDAHooksRegistry();
    if (!registry->Has("CUDAHooks")) {
      // Preferred priority: when a CUDA build's libtorch_cuda loads later, its own registration is skipped
      // instead of clashing with this one.
      registry->Register(
          "CUDAHooks",
          [](at::CUDAHooksArgs args) -> std::unique_ptr<at::CUDAHooksInterface> {
            return std::make_unique<FakeCUDAHooks>(args);
          },
          c10::REGISTRY_PREFERRED);
      g_hooks_installed = true;
    }
  }
};

Installer g_installer;

}  // namespace

// The library is built with hidden visibility (build.py): these are its only exported symbols.
#define PHANTORA_API __attribute__((visibility("default")))

extern "C" {

// 1 if this library's guard is the registered CUDA guard (0: a CUDA build's real guard is in place).
PHANTORA_API int phantora_guard_installed() { return g_guard_installed ? 1 : 0; }

// Replace whatever CUDA guard is registered (a CUDA build's real one) with this library's no-op guard, so that
// device guards never touch a real GPU and accept every simulated device index. Returns 1.
PHANTORA_API int phantora_force_guard() {
  c10::impl::registerDeviceGuard(c10::DeviceType::CUDA, guard_impl());
  g_guard_installed = true;
  return 1;
}
PHANTORA_API int phantora_hooks_installed() { return g_hooks_installed ? 1 : 0; }
PHANTORA_API int phantora_device_count() { return device_count(); }
PHANTORA_API int phantora_get_device() { return t_device; }
PHANTORA_API void phantora_set_device(int d) {
  if (d >= 0 && d < kMaxDevices) t_device = static_cast<c10::DeviceIndex>(d);
}
PHANTORA_API long long phantora_get_stream(int d) { return (d >= 0 && d < kMaxDevices) ? t_stream[d] : 0; }
PHANTORA_API void phantora_set_stream(int d, long long id) {
  if (d >= 0 && d < kMaxDevices) t_stream[d] = id;
}
PHANTORA_API long long phantora_new_stream_id() { return g_next_stream.fetch_add(1); }
PHANTORA_API void phantora_set_event_callback(EventCallback cb) { g_event_cb.store(cb); }

}  // extern "C"
