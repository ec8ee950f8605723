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
  // The replaced handler runs before the counter moves: Python's flag is set
  // before any wait can see this SIGINT (interrupt.h).
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction != nullptr) prev.sa_sigaction(sig, info, context);
    g_own.count.fetch_add(1, std::memory_order_release);
  } else if (prev.sa_handler == SIG_IGN) {
    // The process ignores SIGINT: so do waits.
  } else if (prev.sa_handler == SIG_DFL) {
    // The default action terminates the process: do just that, once this
    // handler returns (SIGINT is blocked while it runs).
    g_own.count.fetch_add(1, std::memory_order_release);
    struct sigaction dfl{};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);
  } else {
    prev.sa_handler(sig);  // Python's: sets its flag, wakes its main loop
    g_own.count.fetch_add(1, std::memory_order_release);
  }
  errno = saved_errno;
}

InterruptState* State() { return g_state.load(std::memory_order_acquire); }

void RaiseInEffect(InterruptState* s, int64_t count) {
  int64_t in = s->in_effect.load(std::memory_order_acquire);
  while (in < count && !s->in_effect.compare_exchange_weak(in, count, std::memory_order_acq_rel)) {
  }
}

// InterruptCount while the hook has seen more SIGINTs than are in effect.
int64_t CatchUp(InterruptState* s, int64_t seen) {
  std::lock_guard<std::mutex> lock(s->mu);
  const int64_t in = s->in_effect.load(std::memory_order_acquire);
  if (in >= seen) return in;
  const AckRequester requester = s->requester.load(std::memory_order_acquire);
  const auto now = std::chrono::steady_clock::now();
  if (s->noticed <= in) s->noticed_at = now;  // the oldest SIGINT not in effect
  s->noticed = seen;
  if (requester == nullptr || now - s->noticed_at >= kInterruptGrace) {
    RaiseInEffect(s, seen);
    return seen;
  }
  if (s->asked < seen && requester(seen)) s->asked = seen;
  return in;
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
  InterruptState* s = State();
  const int64_t seen = s->count.load(std::memory_order_acquire);
  const int64_t in = s->in_effect.load(std::memory_order_acquire);
  return seen <= in ? in : CatchUp(s, seen);
}

int64_t InterruptsSeen() { return State()->count.load(std::memory_order_acquire); }

void AcknowledgeInterrupt(int64_t count) { RaiseInEffect(State(), count); }

void SetInterruptAckRequester(AckRequester requester) {
  g_own.requester.store(requester, std::memory_order_release);
}

void SetInterruptAborts(bool aborts) {
  g_state.load(std::memory_order_acquire)->aborts.store(aborts, std::memory_order_release);
}

namespace {
std::atomic<bool> g_exiting{false};
}  // namespace

void SetExiting() { g_exiting.store(true, std::memory_order_release); }

bool ExitingAfterInterrupt() {
  return g_exiting.load(std::memory_order_acquire) && InterruptsSeen() > 0;
}

bool InterruptAborts() {
  return g_state.load(std::memory_order_acquire)->aborts.load(std::memory_order_acquire);
}

}  // namespace coarse
