// The runtime's own error and value-or-error types, in plain C++17.
//
// Every phase, device, storage and stream call of the runtime returns a
// Status (success, or a code and a message) or a StatusOr<T> (a value, or
// the Status of why there is none). The codes are named after the XLA FFI's
// ErrorCodes the runtime uses; the XLA binding converts a Status into XLA's
// error at the boundary, code for code and message unchanged
// (xla/status_xla.h), so the runtime itself takes no XLA type.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace coarse {

// The codes the runtime reports, named after XLA's ErrorCode of the same meaning.
enum class StatusCode {
  kOk,
  kCancelled,
  kInvalidArgument,
  kDeadlineExceeded,
  kResourceExhausted,
  kFailedPrecondition,
  kInternal,
};

class Status {
 public:
  Status() = default;  // success
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Success() { return Status(); }
  static Status Cancelled(std::string m) { return Status(StatusCode::kCancelled, std::move(m)); }
  static Status InvalidArgument(std::string m) {
    return Status(StatusCode::kInvalidArgument, std::move(m));
  }
  static Status DeadlineExceeded(std::string m) {
    return Status(StatusCode::kDeadlineExceeded, std::move(m));
  }
  static Status ResourceExhausted(std::string m) {
    return Status(StatusCode::kResourceExhausted, std::move(m));
  }
  static Status FailedPrecondition(std::string m) {
    return Status(StatusCode::kFailedPrecondition, std::move(m));
  }
  static Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

  bool success() const { return code_ == StatusCode::kOk; }
  bool failure() const { return !success(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A T, or the (failed) Status of why there is none.
template <typename T>
class StatusOr {
 public:
  StatusOr(T value) : data_(std::move(value)) {}         // NOLINT: implicit, as a return
  StatusOr(Status status) : data_(std::move(status)) {}  // NOLINT: a failure

  bool has_value() const { return std::holds_alternative<T>(data_); }
  bool has_error() const { return !has_value(); }
  explicit operator bool() const { return has_value(); }

  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  const Status& error() const { return std::get<Status>(data_); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(value()); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace coarse
