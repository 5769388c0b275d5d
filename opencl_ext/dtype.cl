/* Storage-type macros, included before each copy of a family body. The host includes the
 * body four times, so every kernel <name> exists as:
 *   <name>_f32a  float storage, every row start 16-byte aligned: float4 pointer loads
 *                (PoCL compiles these to plain vector loads; vload4 on float* is ~2x slower)
 *   <name>_f32   float storage, any alignment: vload4/vstore4
 *   <name>_f16   half storage (vload_half/vstore_half, round to nearest even), fp32 math;
 *                core OpenCL, so no cl_khr_fp16 needed
 *   <name>_f32n  as f32a, with non-temporal (streaming) float4 stores on CPU devices with a
 *                clang-based compiler (PoCL): for outputs larger than the cache, it saves the
 *                read-for-ownership of every output line (the host picks it above 8 MiB)
 * STORAGE: 0 = f32a, 1 = f32, 2 = f16, 3 = f32n. STC8 is always a cached store (softmax's
 * intermediate, reread at once). LDF4 loads float data (rope's cos/sin) likewise.
 * LD8/ST8 move 8 elements as float8 (two float4 accesses in f32a): exp-heavy kernels do
 * their math on float8, which PoCL compiles to full 256-bit AVX2 (~1.7x faster than float4
 * math there); loads and stores stay float4, so 16-byte alignment is all f32a needs. */
#undef T
#undef SUF
#undef LD1
#undef ST1
#undef LD4
#undef ST4
#undef LDF4
#undef LD8
#undef ST8
#undef STC8
#undef NT_FENCE
#if STORAGE == 2
#define T half
#define SUF _f16
#define LD1(i, p) vload_half((i), (p))
#define ST1(v, i, p) vstore_half((v), (i), (p))
#define LD4(i, p) vload_half4((i), (p))
#define ST4(v, i, p) vstore_half4((v), (i), (p))
#define LDF4(i, p) vload4((i), (p))
#define LD8(i, p) vload_half8((i), (p))
#define ST8(v, i, p) vstore_half8((v), (i), (p))
#define STC8 ST8
#elif STORAGE == 1
#define T float
#define SUF _f32
#define LD1(i, p) ((p)[i])
#define ST1(v, i, p) ((p)[i] = (v))
#define LD4(i, p) vload4((i), (p))
#define ST4(v, i, p) vstore4((v), (i), (p))
#define LDF4(i, p) vload4((i), (p))
#define LD8(i, p) vload8((i), (p))
#define ST8(v, i, p) vstore8((v), (i), (p))
#define STC8 ST8
#else /* 0: f32a, 3: f32n */
#define T float
#if STORAGE == 3
#define SUF _f32n
#else
#define SUF _f32a
#endif
#define LD1(i, p) ((p)[i])
#define ST1(v, i, p) ((p)[i] = (v))
#define LD4(i, p) (((__global const float4 *)(p))[i])
#if STORAGE == 3 && defined(__clang__) && CPU_LAYOUT && defined(__x86_64__)
#define ST4(v, i, p) __builtin_nontemporal_store((float4)(v), ((__global float4 *)(p)) + (i))
/* streaming stores are weakly ordered: fence them before the work-group reports done */
#define NT_FENCE() __builtin_ia32_sfence()
#else
#define ST4(v, i, p) (((__global float4 *)(p))[i] = (v))
#endif
#define LDF4(i, p) (((__global const float4 *)(p))[i])
#define LD8(i, p) ((float8)(LD4(2 * (i), p), LD4(2 * (i) + 1, p)))
#define ST8(v, i, p) do { const float8 v8_ = (v); ST4(v8_.lo, 2 * (i), p); \
                          ST4(v8_.hi, 2 * (i) + 1, p); } while (0)
#define STC8(v, i, p) do { const float8 v8_ = (v); \
                           ((__global float4 *)(p))[2 * (i)] = v8_.lo; \
                           ((__global float4 *)(p))[2 * (i) + 1] = v8_.hi; } while (0)
#endif
#ifndef NT_FENCE
#define NT_FENCE() ((void)0)
#endif
