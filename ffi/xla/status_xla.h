// Where XLA's types meet the runtime's: the one conversion of each.
//
// The runtime takes no XLA type (runtime/status.h, runtime/dtype.h). The
// binding (xla/, and the handlers cpu/ and cuda/ bind) hands XLA a runtime
// Status as XLA's error, code for code and its message unchanged (Python
// raises by the code), and XLA's element types to the runtime as its DType,
// refusing any other here, before a phase runs.
#pragma once

#include <optional>

#include "runtime/dtype.h"
#include "runtime/status.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

// `status` as XLA's error: the same code, the same message.
inline xla::ffi::Error ToXlaError(const Status& status) {
  using xla::ffi::ErrorCode;
  switch (status.code()) {
    case StatusCode::kOk: return xla::ffi::Error::Success();
    case StatusCode::kCancelled: return xla::ffi::Error(ErrorCode::kCancelled, status.message());
    case StatusCode::kInvalidArgument:
      return xla::ffi::Error(ErrorCode::kInvalidArgument, status.message());
    case StatusCode::kDeadlineExceeded:
      return xla::ffi::Error(ErrorCode::kDeadlineExceeded, status.message());
    case StatusCode::kResourceExhausted:
      return xla::ffi::Error(ErrorCode::kResourceExhausted, status.message());
    case StatusCode::kFailedPrecondition:
      return xla::ffi::Error(ErrorCode::kFailedPrecondition, status.message());
    case StatusCode::kInternal: return xla::ffi::Error(ErrorCode::kInternal, status.message());
  }
  return xla::ffi::Error(ErrorCode::kInternal, status.message());
}

// The runtime's dtype of XLA's element type `t`; nullopt for any other than
// float32, bfloat16 and float16.
inline std::optional<DType> AsDType(xla::ffi::DataType t) {
  switch (t) {
    case xla::ffi::DataType::F32: return DType::kF32;
    case xla::ffi::DataType::BF16: return DType::kBF16;
    case xla::ffi::DataType::F16: return DType::kF16;
    default: return std::nullopt;
  }
}

// float32, bfloat16 or float16.
inline bool IsSupported(xla::ffi::DataType t) { return AsDType(t).has_value(); }

// "float32", "bfloat16", "float16", or "an unsupported dtype", for messages.
inline const char* DtypeName(xla::ffi::DataType t) {
  const std::optional<DType> d = AsDType(t);
  return d ? DtypeName(*d) : "an unsupported dtype";
}

}  // namespace coarse
