// The SIGINT hook (see interrupt.h).
#include "runtime/interrupt.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <mutex>

namespace coarse {
namespace {

InterruptState g_own;
std::atomic<InterruptState*> g_state{&g_own};
// The handler the hook replaced, written (under g_arm_mu) before the hook is
// installed, read by the hook.
struct sigaction g_previous;
std::mutex g_arm_mu;

static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "the SIGINT hook needs a lock-free counter to be async-signal-safe");

void OnSigint(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const struct sigaction& prev = g_previous;
  if (prev.sa_flags & SA_SIGINFO) {
    g_own.count.fetch_add(1, std::memory_order_relaxed);
    if (prev.sa_sigaction != nullptr) prev.sa_sigaction(sig, info, context);
  } else if (prev.sa_handler == SIG_IGN) {
    // The process ignores SIGINT: so do waits.
  } else if (prev.sa_handler == SIG_DFL) {
    // The default action terminates the process: do just that, once this
    // handler returns (SIGINT is blocked while it runs).
    g_own.count.fetch_add(1, std::memory_order_relaxed);
    struct sigaction dfl{};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);
  } else {
    g_own.count.fetch_add(1, std::memory_order_relaxed);
    prev.sa_handler(sig);  // Python's: sets its flag, wakes its main loop
  }
  errno = saved_errno;
}

}  // namespace

InterruptState* OwnInterruptState() { return &g_own; }

void UseInterruptState(InterruptState* shared) {
  g_state.store(shared != nullptr ? shared : &g_own, std::memory_order_release);
}

bool ArmInterruptHook() {
  if (g_state.load(std::memory_order_acquire) != &g_own) return true;  // another module hooks
  std::lock_guard<std::mutex> lock(g_arm_mu);
  struct sigaction current{};
  if (sigaction(SIGINT, nullptr, &current) != 0) return false;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == &OnSigint) return true;
  struct sigaction mine{};
  mine.sa_sigaction = &OnSigint;
  // Keep the replaced handler's flags (Python's: SA_ONSTACK, no SA_RESTART,
  // so that its blocking calls see EINTR), never a one-shot reset.
  mine.sa_flags = (current.sa_flags & ~SA_RESETHAND) | SA_SIGINFO;
  mine.sa_mask = current.sa_mask;
  g_previous = current;
  return sigaction(SIGINT, &mine, nullptr) == 0;
}

int64_t InterruptCount() {
  return g_state.load(std::memory_order_acquire)->count.load(std::memory_order_acquire);
}

void SetInterruptAborts(bool aborts) {
  g_state.load(std::memory_order_acquire)->aborts.store(aborts, std::memory_order_release);
}

bool InterruptAborts() {
  return g_state.load(std::memory_order_acquire)->aborts.load(std::memory_order_acquire);
}

}  // namespace coarse
