// StreamDevice's copy streams (see stream_device.h, its constructor): the
// order between the worker's stream and the streams its copies down to a
// proxy in host memory, and up from it, run on.
#include "runtime/stream_device.h"

namespace coarse {

Status StreamDevice::SideWaits(Stream& side, StreamEvent mark) {
  // Not Enqueue: a record is no work of its own.
  Status e = stream_->Record(mark);
  return e.failure() ? e : side.Wait(mark, self_);
}

Status StreamDevice::WaitForSide(Stream& side, StreamEvent mark) {
  Status e = side.Record(mark);
  return e.failure() ? e : Enqueue()->Wait(mark, self_);
}

Status StreamDevice::StartUps() {
  if (ups_started_) return Status::Success();
  Status e = SideWaits(*ups_, marks_->up_main);
  if (e.success()) ups_started_ = true;
  return e;
}

Status StreamDevice::JoinUps() {
  if (!ups_unjoined_) return Status::Success();
  Status e = WaitForSide(*ups_, marks_->up_done);
  if (e.success()) ups_unjoined_ = false;
  return e;
}

Status StreamDevice::MarkForCopies() {
  if (marked_) return Status::Success();
  Status e = SideWaits(*copies_, marks_->main);
  if (e.success()) marked_ = true;
  return e;
}

Status StreamDevice::CopyDown(const Outbound& o) {
  Status e = MarkForCopies();
  if (e.failure()) return e;
  marks_->unjoined = true;
  return copies_->Download(o.dst, o.src, static_cast<size_t>(o.n) * sizeof(float),
                           "push: copy down to the proxy in host memory");
}

Status StreamDevice::JoinCopies() {
  if (marks_ == nullptr || !marks_->unjoined) return Status::Success();
  Status e = WaitForSide(*copies_, marks_->copied);
  if (e.success()) marks_->unjoined = false;
  return e;
}

}  // namespace coarse
