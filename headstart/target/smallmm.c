/* headstart small-row fp32 matmul: y = x @ w.T (+ b) for a handful of rows of x.
 *
 * Built on first use by headstart/target/smallmm.py with the system C compiler
 * (-O3 -march=native -ffp-contract=fast [-fopenmp]) and called through ctypes.
 *
 * Why: decoding multiplies 1-64 rows by every weight matrix of the model. That is memory-bound
 * (each weight is read once per forward) plus a little compute, and BLAS's small-row paths
 * do it badly on some CPUs (MKL on AMD EPYC: ~11 GB/s for one row, ~30 GFLOPS for 8 rows, and
 * no gain from a second thread). This kernel streams each weight row once, keeps all rows'
 * accumulators in vector registers and prefetches the rows ahead.
 *
 * Written with GCC/Clang vector extensions (16 floats per vector) so the compiler lowers it to
 * AVX-512, AVX2 or NEON for the machine it is built on: no intrinsics, no per-ISA code.
 *
 * Exactness: every output element is the same chain of fused multiply-adds over k in steps of 16
 * lanes, a fixed lane sum, then the scalar tail, whatever the row count, the block it falls in
 * and the thread count. So rows computed together equal rows computed one at a time bit for bit
 * (a tree verify's matmuls equal sequential decoding's).
 */
#include <stddef.h>

typedef float vf __attribute__((vector_size(64), aligned(4))); /* 16 floats, unaligned access */

#define LANES 16
/* Prefetch the weight rows two 4-row blocks ahead into L2 (locality 2: prefetcht1 on x86).
 * Measured, all of SmolLM2's matmuls at 1 thread on AMD EPYC: no prefetch or prefetch into L1
 * (locality 3) 38-40 ms for 1 row, 52 for 8; into L2 28 and 34. At 2 threads: 18 and 19 ms. */
#define AHEAD 8
#define LOCALITY 2

static inline vf load(const float *p) {
    vf v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

/* A halving tree (lane i + lane i+8, then +4, +2, +1), which compilers vectorize, rather than 15
 * dependent scalar adds: ~5% off the 8-32-row matmuls (16 sums per 8x2 block). Plain C on
 * purpose: __builtin_shufflevector needs GCC >= 12. */
static inline float lane_sum(vf v) {
    float t[LANES];
    __builtin_memcpy(t, &v, sizeof t);
    for (int i = 0; i < 8; i++) t[i] += t[i + 8];
    for (int i = 0; i < 4; i++) t[i] += t[i + 4];
    for (int i = 0; i < 2; i++) t[i] += t[i + 2];
    return t[0] + t[1];
}

/* MB rows of x times R rows of w; MB and R are constants so the MB x R accumulators stay in
 * registers (8 x 2 = 16 of AVX-512's 32). */
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
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[m][r] += xv * wv[r];       \
            }                                                                                      \
        }                                                                                          \
        for (int m = 0; m < MB; m++)                                                               \
            for (int r = 0; r < R; r++) {                                                          \
                float s = lane_sum(acc[m][r]);                                                     \
                for (long t = k; t < K; t++) s += x[m * ldx + t] * w[r * K + t];                   \
                y[m * ldy + r] = s;                                                                \
            }                                                                                      \
    }

KERNEL(8, 2)
KERNEL(4, 4)
KERNEL(2, 4)
KERNEL(1, 4)
KERNEL(8, 1)
KERNEL(4, 1)
KERNEL(2, 1)
KERNEL(1, 1)

/* All M rows of x against 4 consecutive rows of w. */
static void block4(const float *x, long ldx, const float *w, long K, float *y, long ldy, long M) {
    long m = 0;
    for (; m + 8 <= M; m += 8) {
        k_8_2(x + m * ldx, ldx, w, K, y + m * ldy, ldy);
        k_8_2(x + m * ldx, ldx, w + 2 * K, K, y + m * ldy + 2, ldy);
    }
    for (; m + 4 <= M; m += 4) k_4_4(x + m * ldx, ldx, w, K, y + m * ldy, ldy);
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

/* For the loader: the lane width this build was made for (a sanity check, not a capability). */
int headstart_small_matmul_lanes(void) { return LANES; }
