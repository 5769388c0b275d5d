/* Storage-type macros, included before each copy of a family body. The host includes the
 * body three times, so every kernel <name> exists as:
 *   <name>_f32a  float storage, every row start 16-byte aligned: float4 pointer loads
 *                (PoCL compiles these to plain vector loads; vload4 on float* is ~2x slower)
 *   <name>_f32   float storage, any alignment: vload4/vstore4
 *   <name>_f16   half storage (vload_half/vstore_half, round to nearest even), fp32 math;
 *                core OpenCL, so no cl_khr_fp16 needed
 * STORAGE: 0 = f32a, 1 = f32, 2 = f16. LDF4 loads float data (rope's cos/sin) likewise. */
#undef T
#undef SUF
#undef LD1
#undef ST1
#undef LD4
#undef ST4
#undef LDF4
#if STORAGE == 2
#define T half
#define SUF _f16
#define LD1(i, p) vload_half((i), (p))
#define ST1(v, i, p) vstore_half((v), (i), (p))
#define LD4(i, p) vload_half4((i), (p))
#define ST4(v, i, p) vstore_half4((v), (i), (p))
#define LDF4(i, p) vload4((i), (p))
#elif STORAGE == 1
#define T float
#define SUF _f32
#define LD1(i, p) ((p)[i])
#define ST1(v, i, p) ((p)[i] = (v))
#define LD4(i, p) vload4((i), (p))
#define ST4(v, i, p) vstore4((v), (i), (p))
#define LDF4(i, p) vload4((i), (p))
#else
#define T float
#define SUF _f32a
#define LD1(i, p) ((p)[i])
#define ST1(v, i, p) ((p)[i] = (v))
#define LD4(i, p) (((__global const float4 *)(p))[i])
#define ST4(v, i, p) (((__global float4 *)(p))[i] = (v))
#define LDF4(i, p) (((__global const float4 *)(p))[i])
#endif
