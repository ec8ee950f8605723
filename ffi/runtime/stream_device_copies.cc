// StreamDevice's copy streams (see stream_device.h, its constructor): the
// order between the worker's stream and the streams its copies down to a
// proxy in host memory, and up from it, run on.
#include "runtime/stream_device.h"

namespace coarse {
namespace ffi = xla::ffi;

ffi::Error StreamDevice::SideWaits(Stream& side, StreamEvent mark) {
  // Not Enqueue: a record is no work of its own.
  ffi::Error e = stream_->Record(mark);
  return e.failure() ? e : side.Wait(mark, self_);
}

ffi::Error StreamDevice::WaitForSide(Stream& side, StreamEvent mark) {
  ffi::Error e = side.Record(mark);
  return e.failure() ? e : Enqueue()->Wait(mark, self_);
}

ffi::Error StreamDevice::StartUps() {
  if (ups_started_) return ffi::Error::Success();
  ffi::Error e = SideWaits(*ups_, marks_->up_main);
  if (e.success()) ups_started_ = true;
  return e;
}

ffi::Error StreamDevice::JoinUps() {
  if (!ups_unjoined_) return ffi::Error::Success();
  ffi::Error e = WaitForSide(*ups_, marks_->up_done);
  if (e.success()) ups_unjoined_ = false;
  return e;
}

ffi::Error StreamDevice::MarkForCopies() {
  if (marked_) return ffi::Error::Success();
  ffi::Error e = SideWaits(*copies_, marks_->main);
  if (e.success()) marked_ = true;
  return e;
}

ffi::Error StreamDevice::CopyDown(const Outbound& o) {
  ffi::Error e = MarkForCopies();
  if (e.failure()) return e;
  marks_->unjoined = true;
  return copies_->Download(o.dst, o.src, static_cast<size_t>(o.n) * sizeof(float),
                           "push: copy down to the proxy in host memory");
}

ffi::Error StreamDevice::JoinCopies() {
  if (marks_ == nullptr || !marks_->unjoined) return ffi::Error::Success();
  ffi::Error e = WaitForSide(*copies_, marks_->copied);
  if (e.success()) marks_->unjoined = false;
  return e;
}

}  // namespace coarse
