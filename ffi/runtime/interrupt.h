// Ctrl-C while a step waits in the runtime.
//
// A step stalled on a missing push sits in Session::Wait on XLA's threads
// while Python's main thread sits in a C++ wait (PjRt), so Python's SIGINT
// handler cannot run until the wait's deadline (timeout_s) expires. The
// runtime therefore installs its own SIGINT hook, chained to the handler it
// replaces (Python's, which still sets its flag and later raises
// KeyboardInterrupt): the hook only bumps an atomic counter, which is
// async-signal-safe. Session::Wait waits in short slices (kInterruptPoll) and,
// when the counter moved since the run's first session opened, poisons the
// session with an "interrupted (Ctrl-C)" error, so every device of the step
// gives up at once.
//
// Python's KeyboardInterrupt comes first. An abandoned step's error reaches
// Python through jax (block_until_ready, float(loss), the next dispatch): if
// it arrived while Python's flag was still pending, that JaxRuntimeError
// would leave the user's loop, past its `except KeyboardInterrupt`, and the
// KeyboardInterrupt would fire later, at interpreter exit ("lost
// sys.stderr", status 1). jax's waits check Python's signals only every so
// often, so which came first was a race (about 1 in 8 with a stalled step,
// up to 30% in a loop that runs ahead on a busy machine). So a SIGINT takes
// effect on the waits (InterruptCount moves) only once Python's main thread
// acknowledged it: the first wait that sees it asks Python, through the
// extension module's AckRequester (Py_AddPendingCall), to run a pending call
// that calls AcknowledgeInterrupt. CPython runs pending calls only after its
// pending signals, and its default SIGINT handler raises KeyboardInterrupt,
// which ends that round: so the acknowledgement runs at a later bytecode,
// after KeyboardInterrupt was raised. Where Python cannot acknowledge (no
// requester, as in the C++ self-tests; the interpreter exiting; a main thread
// stuck in C++ that never checks signals), the SIGINT takes effect
// kInterruptGrace after a wait first saw it, as a fallback.
// A step's dispatch acknowledges too (take_interrupts, from
// coarse_jax._ffi.arm_interrupt_hook on the main thread, after running
// Python's pending signal handlers), without waiting for the pending call.
//
// Python may replace the process's SIGINT handler at any time (signal.signal):
// ArmInterruptHook() re-installs the hook, chained to the new handler, when it
// finds it displaced. It costs one sigaction(2) query; the CPU module calls it
// when it loads, the registry whenever a run opens its first session, and
// coarse_jax._ffi.arm_interrupt_hook() before a step is dispatched.
//
// One hook per process: each extension module has its own copy of this
// state, and two hooks chained to each other would, once one re-arms, call
// each other forever. So the CUDA module does not hook when the CPU module is
// loaded: coarse_jax/_ffi/extension.py hands it the CPU module's state
// (UseInterruptState) and its waits read that.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

namespace coarse {

// Asks Python's main thread to call AcknowledgeInterrupt(count) once it has
// handled its pending signals; returns false if the request could not be made
// (then it is asked again at the next poll).
using AckRequester = bool (*)(int64_t count);

struct InterruptState {
  std::atomic<int64_t> count{0};      // SIGINTs seen by the hook
  std::atomic<bool> aborts{true};     // see SetInterruptAborts
  std::atomic<int64_t> in_effect{0};  // SIGINTs that stop waits (InterruptCount)
  std::atomic<AckRequester> requester{nullptr};
  // The slow path of InterruptCount, while count > in_effect.
  std::mutex mu;
  int64_t asked = 0;    // the newest count Python was asked to acknowledge
  int64_t noticed = 0;  // the newest count a wait has seen
  std::chrono::steady_clock::time_point noticed_at;  // when the oldest not in effect was seen
};

// This module's own state (the one its hook writes).
InterruptState* OwnInterruptState();
// From now on this module reads `shared` (another module's, which hooks
// SIGINT) and never installs its own hook.
void UseInterruptState(InterruptState* shared);

// How often a waiting device looks at the interrupt counter.
inline constexpr std::chrono::milliseconds kInterruptPoll{100};
// How long a SIGINT waits for Python's acknowledgement before it takes effect
// anyway.
inline constexpr std::chrono::milliseconds kInterruptGrace{1000};

// Installs the SIGINT hook unless it is already the process's handler;
// returns whether it is installed now (true, doing nothing, where the module
// reads another module's state).
bool ArmInterruptHook();

// SIGINTs in effect: seen by the hook since the process started (an ignored
// SIGINT, SIG_IGN before the hook, is not counted) and acknowledged by Python
// (AcknowledgeInterrupt), or seen by a wait kInterruptGrace ago. A wait that
// calls it while a SIGINT is not yet in effect asks for the acknowledgement.
int64_t InterruptCount();
// SIGINTs the hook has seen, in effect or not.
int64_t InterruptsSeen();
// Python's main thread has handled its signals up to `count` (called from the
// pending call that AckRequester asks for): those SIGINTs take effect.
void AcknowledgeInterrupt(int64_t count);
// Installs the requester of this module's state (the extension module's, on
// Python's C API); nullptr: SIGINTs take effect at once.
void SetInterruptAckRequester(AckRequester requester);

// Whether an interrupt aborts waits (default true). Python turns it off while
// its SIGINT handler is not the default one (a handler that, say, asks the
// training loop to stop after the current step must see the step finish).
void SetInterruptAborts(bool aborts);
bool InterruptAborts();

// The interpreter is exiting (Python's atexit, coarse_jax/_ffi/extension.py).
// After a Ctrl-C, a step that XLA ran after the SIGINT (a loop running ahead
// dispatched it before) is not interrupted by it, and where its inputs failed
// on some devices its other devices would wait for them until timeout_s,
// while jax's own exit waits for the step: the process would not exit for up
// to timeout_s. So once exiting, any SIGINT seen stops every wait.
void SetExiting();
bool ExitingAfterInterrupt();

}  // namespace coarse
