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
// gives up at once and Python raises KeyboardInterrupt when it regains
// control.
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

namespace coarse {

struct InterruptState {
  std::atomic<int64_t> count{0};   // SIGINTs seen by the hook
  std::atomic<bool> aborts{true};  // see SetInterruptAborts
};

// This module's own state (the one its hook writes).
InterruptState* OwnInterruptState();
// From now on this module reads `shared` (another module's, which hooks
// SIGINT) and never installs its own hook.
void UseInterruptState(InterruptState* shared);

// How often a waiting device looks at the interrupt counter.
inline constexpr std::chrono::milliseconds kInterruptPoll{100};

// Installs the SIGINT hook unless it is already the process's handler;
// returns whether it is installed now (true, doing nothing, where the module
// reads another module's state).
bool ArmInterruptHook();

// SIGINTs the hook has seen since the process started (an ignored SIGINT,
// SIG_IGN before the hook, is not counted).
int64_t InterruptCount();

// Whether an interrupt aborts waits (default true). Python turns it off while
// its SIGINT handler is not the default one (a handler that, say, asks the
// training loop to stop after the current step must see the step finish).
void SetInterruptAborts(bool aborts);
bool InterruptAborts();

}  // namespace coarse
