/* headstart small-row fp32 matmul: y = x @ w.T (+ b) for a handful of rows of x.
 *
 * Built on first use by headstart/targets/smallmm.py with the system C compiler
 * (-O3 -march=native -ffp-contract=fast [-fopenmp]) and called through ctypes.
 *
 * Why: decoding multiplies 1-64 rows by every weight matrix of the model. That is memory-bound
 * (each weight is read once per forward) plus a little compute, and BLAS's small-row paths
 * do it badly on some CPUs (MKL on AMD EPYC: ~11 GB/s for one row, ~30 GFLOPS for 8 rows, and
 * no gain from a second thread). This kernel streams each weight row once, keeps all rows'
 * accumulators in vector registers and prefetches the rows ahead.
 *
 * Written with GCC/Clang vector extensions so the compiler lowers it to AVX-512, AVX2 or NEON for
 * the machine it is built on: no intrinsics. Only the vector width and the accumulator block
 * depend on the ISA, because the block must fit the register file: AVX-512 (32 registers of 16
 * floats) takes 8 x-rows x 2 w-rows; AVX2 (16 registers of 8 floats) at most 4 x 2. A 16-float
 * type on AVX2 is two registers per vector: the 8 x 2 block then spilled to the stack and the
 * kernel ran 2-4x slower than MKL (measured on an AVX2 EPYC, see smallmm.py).
 *
 * Exactness: every output element is the same chain of fused multiply-adds over k in steps of
 * LANES lanes, a fixed lane sum, then the scalar tail, whatever the row count, the block it falls
 * in and the thread count. So rows computed together equal rows computed one at a time bit for
 * bit (a tree verify's matmuls equal sequential decoding's) on any one build.
 */
#include <stddef.h>
#if defined(__FMA__) || defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define LANES 16
#define WIDE_BLOCKS 1 /* 8 x 2 and 4 x 4 accumulators: 16 of 32 registers */
#else
#define LANES 8
#define WIDE_BLOCKS 0 /* 4 x 2 accumulators + 2 weight vectors + 1 x vector: 11 of 16 */
#endif

/* may_alias and aligned(4): a plain dereference is an unaligned vector load of floats. (A
 * memcpy into a local vector, as before, went through the stack on GCC 12 for znver3.) */
typedef float vf __attribute__((vector_size(LANES * 4), aligned(4), may_alias));

/* Prefetch the weight rows two 4-row blocks ahead into L2 (locality 2: prefetcht1 on x86).
 * Measured, all of SmolLM2's matmuls at 1 thread on AMD EPYC: no prefetch or prefetch into L1
 * (locality 3) 38-40 ms for 1 row, 52 for 8; into L2 28 and 34. At 2 threads: 18 and 19 ms. */
#define AHEAD 8
#define LOCALITY 2

static inline vf load(const float *p) { return *(const vf *)p; }

/* acc + x * w as one fused multiply-add, explicitly: -ffp-contract=fast alone left GCC 12 free
 * to fuse in some kernels and not in others (k_1_1's loop became a vmulps/vaddps reduction on
 * znver3), which broke the bit-equality between row counts that the tree verify relies on. */
static inline vf madd(vf acc, vf x, vf w) {
#if LANES == 16 && defined(__AVX512F__)
    return (vf)_mm512_fmadd_ps((__m512)x, (__m512)w, (__m512)acc);
#elif LANES == 8 && defined(__FMA__)
    return (vf)_mm256_fmadd_ps((__m256)x, (__m256)w, (__m256)acc);
#else /* no FMA unit (or not x86): the compiler's contraction; tests/targets/test_smallmm.py checks */
    return acc + x * w;
#endif
}

/* A halving tree (lane i + lane i+LANES/2, ...), which compilers vectorize, rather than LANES-1
 * dependent scalar adds: ~5% off the 8-32-row matmuls. */
static inline float lane_sum(vf v) {
    float t[LANES];
    for (int i = 0; i < LANES; i++) t[i] = v[i];
    for (int h = LANES / 2; h >= 1; h /= 2)
        for (int i = 0; i < h; i++) t[i] += t[i + h];
    return t[0];
}

/* MB rows of x times R rows of w; MB and R are constants so the MB x R accumulators stay in
 * registers (see WIDE_BLOCKS). */
#define KERNEL(MB, R)                                                                              \
    static inline void k_##MB##_##R(const float *x, long ldx, const float *w, long K, float *y,    \
                                    long ldy) {                                                    \
        vf acc[MB][R];                                                                             \
        _Pragma("GCC unroll 8") for (int m = 0; m < MB; m++)                                       \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[m][r] = (vf){0};               \
        long k = 0;                                                                                \
        for (; k + LANES <= K; k += LANES) {                                                       \
            vf wv[R];                                                                              \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                  \
                __builtin_prefetch(w + (r + AHEAD) * K + k, 0, LOCALITY);                                 \
                wv[r] = load(w + r * K + k);                                                       \
            }                                                                                      \
            _Pragma("GCC unroll 8") for (int m = 0; m < MB; m++) {                                 \
                vf xv = load(x + m * ldx + k);                                                     \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[m][r] = madd(acc[m][r], xv, wv[r]);\
            }                                                                                      \
        }                                                                                          \
        for (int m = 0; m < MB; m++)                                                               \
            for (int r = 0; r < R; r++) {                                                          \
                float s = lane_sum(acc[m][r]);                                                     \
                for (long t = k; t < K; t++) s = __builtin_fmaf(x[m * ldx + t], w[r * K + t], s);              \
                y[m * ldy + r] = s;                                                                \
            }                                                                                      \
    }

#if WIDE_BLOCKS
KERNEL(8, 2)
KERNEL(4, 4)
#else
KERNEL(4, 2)
#endif
KERNEL(2, 4)
KERNEL(1, 4)
KERNEL(8, 1)
KERNEL(4, 1)
KERNEL(2, 1)
KERNEL(1, 1)

/* All M rows of x against 4 consecutive rows of w. */
static void block4(const float *x, long ldx, const float *w, long K, float *y, long ldy, long M) {
    long m = 0;
#if WIDE_BLOCKS
    for (; m + 8 <= M; m += 8) {
        k_8_2(x + m * ldx, ldx, w, K, y + m * ldy, ldy);
        k_8_2(x + m * ldx, ldx, w + 2 * K, K, y + m * ldy + 2, ldy);
    }
    for (; m + 4 <= M; m += 4) k_4_4(x + m * ldx, ldx, w, K, y + m * ldy, ldy);
#else /* the second pass over the 4 weight rows (9 KB for K = 576) reads them from L1 */
    for (; m + 4 <= M; m += 4) {
        k_4_2(x + m * ldx, ldx, w, K, y + m * ldy, ldy);
        k_4_2(x + m * ldx, ldx, w + 2 * K, K, y + m * ldy + 2, ldy);
    }
#endif
    for (; m + 2 <= M; m += 2) k_2_4(x + m * ldx, ldx, w, K, y + m * ldy, ldy);
    for (; m < M; m++) k_1_4(x + m * ldx, ldx, w, K, y + m * ldy, ldy);
}

/* All M rows of x against one row of w (the N % 4 tail). */
static void block1(const float *x, long ldx, const float *w, long K, float *y, long ldy, long M) {
    long m = 0;
    for (; m + 8 <= M; m += 8) k_8_1(x + m * ldx, ldx, w, K, y + m * ldy, ldy);
    for (; m + 4 <= M; m += 4) k_4_1(x + m * ldx, ldx, w, K, y + m * ldy, ldy);
    for (; m + 2 <= M; m += 2) k_2_1(x + m * ldx, ldx, w, K, y + m * ldy, ldy);
    for (; m < M; m++) k_1_1(x + m * ldx, ldx, w, K, y + m * ldy, ldy);
}

/* x: (M, K) with row stride ldx; w: (N, K) contiguous; b: (N,) or NULL; y: (M, N), row stride ldy.
 * Threads split the weight rows (each thread streams its own share of w). */
void headstart_small_matmul(const float *x, long ldx, const float *w, const float *b, float *y,
                            long ldy, long M, long N, long K, int threads) {
    long blocks = N / 4;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
    for (long i = 0; i < blocks; i++) block4(x, ldx, w + 4 * i * K, K, y + 4 * i, ldy, M);
    for (long n = 4 * blocks; n < N; n++) block1(x, ldx, w + n * K, K, y + n, ldy, M);
    if (b)
        for (long m = 0; m < M; m++)
            for (long n = 0; n < N; n++) y[m * ldy + n] += b[n];
}

/* ---- weights kept in the GGUF's blocks (Q4_1, Q8_0) -----------------------------------------
 *
 * A GGUF target's fp32 weights are its blocks dequantised (gguf-py: w = d * q + m for Q4_1, d * q
 * for Q8_0, in fp32). Reading the blocks instead moves 0.75 (Q4_1) or 1.125 (Q8_0) bytes per
 * weight instead of 4, and a decode step is a pass over the weights. Each thread dequantises 4
 * weight rows into a buffer it keeps in L1/L2 and runs the fp32 block above on it, so every output
 * is the same fused multiply-add chain over the same fp32 weights as the fp32 entry point: the
 * results are equal bit for bit (tests/targets/test_smallmm.py). d * q is exact in fp32 (an fp16
 * d has 11 significant bits and q at most 8), so fma(q, d, m) rounds once where gguf-py's
 * (d * q) + m also rounds once: the same fp32 weight. Layout (repacked by smallmm.py): Q4_1 nibbles
 * (N, K/2) bytes, block j of a row holding element i in the low nibble of byte i and i + 16 in the
 * high one (GGUF's order); d and m (N, K/32) fp32. Q8_0: (N, K) int8 and d (N, K/32). K % 32 == 0
 * for both (bf16, below, takes any K). */
typedef unsigned char vbu __attribute__((vector_size(LANES), aligned(1), may_alias));
typedef signed char vbs __attribute__((vector_size(LANES), aligned(1), may_alias));
typedef int vi __attribute__((vector_size(LANES * 4)));

static inline void store(float *p, vf v) { *(vf *)p = v; }

/* LANES bytes widened to ints: one vpmovzx/vpmovsx where the ISA has it (GCC 12 lowered the
 * generic __builtin_convertvector of a byte vector to 16 scalar loads and inserts: 3x slower). */
static inline vi widen_u8(const unsigned char *p) {
#if LANES == 16 && defined(__AVX512F__)
    return (vi)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
#elif LANES == 8 && defined(__AVX2__)
    return (vi)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
#else
    return __builtin_convertvector(*(const vbu *)p, vi);
#endif
}

static inline vi widen_s8(const signed char *p) {
#if LANES == 16 && defined(__AVX512F__)
    return (vi)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
#elif LANES == 8 && defined(__AVX2__)
    return (vi)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
#else
    return __builtin_convertvector(*(const vbs *)p, vi);
#endif
}

static void dequant_q4_1(const unsigned char *qs, const float *d, const float *m, long K, float *out) {
    for (long b = 0; b < K / 32; b++) {
        vf dv = (vf){0} + d[b], mv = (vf){0} + m[b];
        const unsigned char *q = qs + 16 * b;
        _Pragma("GCC unroll 4") for (int o = 0; o < 32; o += LANES) {
            vi n = widen_u8(q + (o & 15));
            n = o >= 16 ? n >> 4 : n & 15;
            store(out + 32 * b + o, madd(mv, __builtin_convertvector(n, vf), dv));
        }
    }
}

static void dequant_q8_0(const signed char *qs, const float *d, long K, float *out) {
    for (long b = 0; b < K / 32; b++) {
        vf dv = (vf){0} + d[b];
        _Pragma("GCC unroll 4") for (int o = 0; o < 32; o += LANES)
            store(out + 32 * b + o, __builtin_convertvector(widen_s8(qs + 32 * b + o), vf) * dv);
    }
}

/* bf16 rows (N, K) of a weight whose fp32 values are all exactly bf16 (heads shipped in bf16, a
 * checkpoint stored in bf16 and loaded as fp32): widening is a 16-bit shift, exact, so the fp32
 * block sees the same weights and gives the same bits in half the memory of fp32. Any K. */
typedef unsigned int vu __attribute__((vector_size(LANES * 4)));

static inline vi widen_u16(const unsigned short *p) {
#if LANES == 16 && defined(__AVX512F__)
    return (vi)_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
#elif LANES == 8 && defined(__AVX2__)
    return (vi)_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
#else
    typedef unsigned short vhu __attribute__((vector_size(LANES * 2), aligned(2), may_alias));
    return __builtin_convertvector(*(const vhu *)p, vi);
#endif
}

static void dequant_bf16(const unsigned short *qs, long K, float *out) {
    long k = 0;
    for (; k + LANES <= K; k += LANES) {
        store(out + k, (vf)((vu)widen_u16(qs + k) << 16)); /* vector casts keep the bits */
    }
    for (; k < K; k++) {
        unsigned int bits = (unsigned int)qs[k] << 16;
        __builtin_memcpy(out + k, &bits, 4);
    }
}

/* kind 0: Q4_1 (qs nibbles, d, m); kind 1: Q8_0 (qs int8, d; m unused); kind 2: bf16 (qs (N, K)
 * 16-bit, d and m unused). Otherwise as headstart_small_matmul, with y computed from the
 * dequantised weights. */
void headstart_small_matmul_blocks(const float *x, long ldx, int kind, const void *qs, const float *d,
                                   const float *m, const float *b, float *y, long ldy, long M, long N,
                                   long K, int threads) {
    long blocks = (N + 3) / 4, per = K / 32; /* per: scale blocks per weight row */
    long row_bytes = kind == 0 ? K / 2 : kind == 1 ? K : 2 * K;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) if (threads > 1)
#endif
    {
        float *w = __builtin_alloca(4 * K * sizeof(float) + 64);
        w = (float *)(((unsigned long)w + 63) & ~63UL);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (long i = 0; i < blocks; i++) {
            long rows = N - 4 * i < 4 ? N - 4 * i : 4;
            /* the quantised rows two blocks ahead into L2 (the fp32 block's own prefetch points into
             * this thread's buffer): all SmolLM2 matmuls, 2 threads, 8 rows 16.1 -> 13.9 ms, 1 row
             * 5.8 -> 5.6 (three interleaved runs, AVX-512) */
            if (i + 2 < blocks) {
                long from = (4 * i + 8) * row_bytes, to = (4 * i + 12) * row_bytes;
                to = to < N * row_bytes ? to : N * row_bytes;
                for (long o = from; o < to; o += 64) __builtin_prefetch((const char *)qs + o, 0, LOCALITY);
            }
            for (long r = 0; r < rows; r++) {
                long n = 4 * i + r;
                const unsigned char *q = (const unsigned char *)qs + n * row_bytes;
                if (kind == 0) dequant_q4_1(q, d + n * per, m + n * per, K, w + r * K);
                else if (kind == 1) dequant_q8_0((const signed char *)q, d + n * per, K, w + r * K);
                else dequant_bf16((const unsigned short *)q, K, w + r * K);
            }
            if (rows == 4) block4(x, ldx, w, K, y + 4 * i, ldy, M);
            else
                for (long r = 0; r < rows; r++) block1(x, ldx, w + r * K, K, y + 4 * i + r, ldy, M);
        }
    }
    if (b)
        for (long mm = 0; mm < M; mm++)
            for (long n = 0; n < N; n++) y[mm * ldy + n] += b[n];
}

/* For the loader: the lane width this build was made for (a sanity check, not a capability). */
int headstart_small_matmul_lanes(void) { return LANES; }
