/* glibc's vector math library (libmvec, linked with -lmvec): lets the kernels' loops call 8-wide
 * logf/expf/sinf/cosf. */
#ifndef ATTN_LIBMVEC_H
#define ATTN_LIBMVEC_H
#if defined(ATTN_LIBMVEC) && defined(__GNUC__) && !defined(__clang__)
float logf(float) __attribute__((__simd__("notinbranch")));
float expf(float) __attribute__((__simd__("notinbranch")));
float sinf(float) __attribute__((__simd__("notinbranch")));
float cosf(float) __attribute__((__simd__("notinbranch")));
#endif
#endif
