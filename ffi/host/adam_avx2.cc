// AdamAvx2 (see adam_avx2.h). Built with -mavx2 alone (CMakeLists.txt).
#include "host/adam_avx2.h"

#if defined(__x86_64__) && defined(__GNUC__)  // as element_loops.cc's COARSE_ADAM_AVX2
#include <immintrin.h>

namespace coarse::cpu {

namespace {

// Eight floats, GCC's and Clang's vector extension: +, -, *, / and a scalar
// operand (broadcast) work lane by lane, so AdamStep's body compiles as is.
typedef float Floats8 __attribute__((vector_size(32)));

struct Avx2Lane {
  static Floats8 Sqrt(Floats8 x) { return reinterpret_cast<Floats8>(_mm256_sqrt_ps(x)); }
};

inline bool Aligned32(const float* p) { return (reinterpret_cast<uintptr_t>(p) & 31) == 0; }
inline Floats8 Load(const float* p) { return reinterpret_cast<Floats8>(_mm256_loadu_ps(p)); }

}  // namespace

int64_t AdamAvx2(const OptScalars& o, float* grad_io, const float* w_in, float* w_out,
                 const float* m_in, const float* v_in, float* m_out, float* v_out, int64_t n) {
  const int64_t vec = n / 8 * 8;
  const bool stream =
      n >= kStreamStoresFrom && Aligned32(w_out) && Aligned32(m_out) && Aligned32(v_out);
  for (int64_t i = 0; i < vec; i += 8) {
    Floats8 m = Load(m_in + i), v = Load(v_in + i);
    const __m256 out = reinterpret_cast<__m256>(
        AdamStep<Floats8, Avx2Lane>(o, Load(grad_io + i), Load(w_in + i), &m, &v));
    _mm256_storeu_ps(grad_io + i, out);
    if (stream) {
      _mm256_stream_ps(w_out + i, out);
      _mm256_stream_ps(m_out + i, reinterpret_cast<__m256>(m));
      _mm256_stream_ps(v_out + i, reinterpret_cast<__m256>(v));
    } else {
      _mm256_storeu_ps(w_out + i, out);
      _mm256_storeu_ps(m_out + i, reinterpret_cast<__m256>(m));
      _mm256_storeu_ps(v_out + i, reinterpret_cast<__m256>(v));
    }
  }
  if (stream) _mm_sfence();
  return vec;
}

}  // namespace coarse::cpu

#endif
