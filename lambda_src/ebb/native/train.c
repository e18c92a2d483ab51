/* Ebb's fused training steps: one minibatch of PMF or sparse LR, from the replica's rows
 * to the optimiser's update of them, in one pass over the batch and one over its rows.
 *
 * Each kernel computes what the model's torch path computes (ebb.models.pmf, .logistic
 * and .optim), with the same float32 operations in the same order, so that on x86-64 the
 * results are torch's bits:
 *  - a row's dot product is summed in the order aten sums a float32 row (8-float vectors,
 *    see dot_in_torch_order);
 *  - gradients of a row that recurs in the batch are added in the batch's order, as
 *    torch's index_add_ adds them;
 *  - x.add(y, alpha=a) and x.addcmul(y, z, value=a) round once (a fused multiply-add)
 *    exactly where torch's kernels do: its AVX2 and AVX-512 kernels fuse, its portable
 *    one does not. ebb.native.training asks torch and tells the kernel (ebb_optim).
 * What torch computes with its own vectorised libraries (lazy Adam's square root, MKL's,
 * and per-row bias correction, SLEEF's pow; sparse LR's sigmoid, SLEEF's exp) may differ
 * in the last bit, and the loss is summed in float64 (then rounded to float32) where
 * torch sums float32.
 *
 * Nothing is applied to the replica: the worker applies a step's updates when it clears.
 * The optimiser's state advances in place for the rows the batch touched (lazy). Built
 * with kernels.c, without fast-math or contraction (ebb.native.build).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { EBB_SGD = 0, EBB_ADAM = 1 };

/* The kernels' bodies are inlined into each instance below, built for its own CPU. */
#define EBB_BODY static inline __attribute__((always_inline))

/* The optimiser, as ebb.models.optim keeps it, its scalars rounded as torch rounds them. */
typedef struct {
    int32_t kind;          /* EBB_SGD or EBB_ADAM */
    int32_t fused_axpy;    /* torch's x.add(y, alpha=a) is fma(y, a, x), else x + a*y */
    int32_t fused_addcmul; /* torch's x.addcmul(y, z, value=a) is fma(a*y, z, x), else x + (a*y)*z */
    int32_t nesterov;      /* SGD */
    float lr_neg;          /* SGD: float32(-lr) */
    float momentum;        /* SGD: float32(momentum); 0 keeps no buffers */
    float beta1, beta2;    /* Adam, float32 */
    float one_minus_beta1, one_minus_beta2;
    /* Adam with steps counted per parameter, at step t: float32(-lr·√(1-β2^t)/(1-β1^t)) and
     * float32(eps·√(1-β2^t)) */
    float step, eps;
    /* Adam with steps counted per row: the float64 terms of the bias correction, and for a
     * row's count n < bias_len, bias_terms[n] = (√(1-β2^n), √(1-β2^n)/(1-β1^n)) */
    double lr, eps_d;
    const double *bias_terms;
    int64_t bias_len;
    double beta1_d, beta2_d; /* (for counts past the table) */
} ebb_optim;

/* One parameter table [N][dim] and the batch's unique rows of it. */
typedef struct {
    const float *table;   /* the replica (read only) */
    int64_t n_rows, dim;
    const int64_t *rows;  /* the unique rows the batch touched, [k] */
    int64_t k;
    float *state0;        /* SGD: momentum buffers (NULL: none); Adam: m — [N][dim], updated in place */
    float *state1;        /* Adam: v */
    double *row_steps;    /* Adam: per-row step counts [N] (NULL: counted per parameter) */
    float *base;          /* out: table[rows], [k][dim] */
    float *delta;         /* out: the rows' update, [k][dim]; the gradient on its way */
} ebb_param;

EBB_BODY float axpy(const ebb_optim *o, float x, float a, float y) { /* x + a·y, as torch's add */
    return o->fused_axpy ? fmaf(y, a, x) : x + a * y;
}

/* How far ahead (rows, or ratings) the loops prefetch what they will read: a batch's rows
 * lie at random in tables larger than the cache, and each row's arithmetic is long enough
 * that the CPU would otherwise meet their misses one at a time. */
#define EBB_AHEAD 16

/* The optimiser state of row r (when there is one). */
EBB_BODY void prefetch_state(const ebb_param *p, int64_t r) {
    if (r >= p->k) return;
    const int64_t at = p->rows[r] * p->dim, last = at + p->dim - 1;
    if (p->state0) {
        __builtin_prefetch(p->state0 + at, 1);
        __builtin_prefetch(p->state0 + last, 1);
    }
    if (p->state1) {
        __builtin_prefetch(p->state1 + at, 1);
        __builtin_prefetch(p->state1 + last, 1);
    }
    if (p->row_steps) __builtin_prefetch(p->row_steps + p->rows[r], 1);
}

/* Adam on `len` entries: their moments m and v advance and their gradient g becomes the
 * update, as SparseAdam.delta computes it. */
EBB_BODY void adam_entries(const ebb_optim *restrict o, float *restrict g, float *restrict m, float *restrict v,
                           int64_t len, float step, float eps) {
    for (int64_t j = 0; j < len; j++) {
        const float gj = g[j];
        const float mj = axpy(o, m[j] * o->beta1, o->one_minus_beta1, gj);
        const float scaled = o->one_minus_beta2 * gj, vb = v[j] * o->beta2;
        const float vj = o->fused_addcmul ? fmaf(scaled, gj, vb) : vb + scaled * gj;
        m[j] = mj;
        v[j] = vj;
        g[j] = (mj / (sqrtf(vj) + eps)) * step;
    }
}

/* Row r of p: its gradient g (dim floats, in the row of p->delta) becomes its update, and
 * its optimiser state advances, as SparseSGD.delta / SparseAdam.delta compute them. */
EBB_BODY void optimise_row(const ebb_optim *restrict o, const ebb_param *restrict p, int64_t r) {
    const int64_t dim = p->dim, at = p->rows[r] * dim;
    float *restrict g = p->delta + r * dim;
    if (o->kind == EBB_SGD) {
        if (o->momentum != 0.0f) {
            float *restrict buf = p->state0 + at;
            for (int64_t j = 0; j < dim; j++) {
                float m = buf[j] * o->momentum;
                m = m + g[j];
                buf[j] = m;
                g[j] = (o->nesterov ? axpy(o, g[j], o->momentum, m) : m) * o->lr_neg;
            }
        } else {
            for (int64_t j = 0; j < dim; j++) g[j] = g[j] * o->lr_neg;
        }
        return;
    }
    float step = o->step, eps = o->eps;
    if (p->row_steps) {
        const double n = p->row_steps[p->rows[r]] + 1.0;
        p->row_steps[p->rows[r]] = n;
        double root2, ratio;
        if (n < (double)o->bias_len) {
            root2 = o->bias_terms[2 * (int64_t)n];
            ratio = o->bias_terms[2 * (int64_t)n + 1];
        } else {
            root2 = sqrt(-pow(o->beta2_d, n) + 1.0);
            ratio = root2 / (-pow(o->beta1_d, n) + 1.0);
        }
        step = (float)(ratio * -o->lr);
        eps = (float)(root2 * o->eps_d);
    }
    adam_entries(o, g, p->state0 + at, p->state1 + at, dim, step, eps);
}

/* Adam on the rows of a weight vector (dim 1, steps counted per parameter), 8 rows at a
 * time: the division and square root of one entry take longer than loading it, and 8
 * entries take one vector instruction each. The same operations per entry. */
EBB_BODY void adam_scalar_rows(const ebb_optim *restrict o, const ebb_param *restrict p) {
    int64_t r = 0;
    for (; r + 8 <= p->k; r += 8) {
        const int64_t *at = p->rows + r;
        float m[8], v[8];
        for (int l = 0; l < 8; l++) {
            m[l] = p->state0[at[l]];
            v[l] = p->state1[at[l]];
        }
        adam_entries(o, p->delta + r, m, v, 8, o->step, o->eps);
        for (int l = 0; l < 8; l++) {
            p->state0[at[l]] = m[l];
            p->state1[at[l]] = v[l];
        }
    }
    for (; r < p->k; r++) optimise_row(o, p, r);
}

/* A loss summed in float64, reported as a float32 value as torch's path reports it: the
 * supervisor adds the workers' loss sums in the order they arrive, and a few float32
 * values add exactly in float64 whatever the order, so the job's loss is reproducible. */
EBB_BODY double reported_loss(double sum) { return (double)(float)sum; }

/* base = table[rows]; 0, or -1 with nothing written when a row is not in the table. */
EBB_BODY int gather(const ebb_param *p) {
    for (int64_t r = 0; r < p->k; r++)
        if ((uint64_t)p->rows[r] >= (uint64_t)p->n_rows) return -1;
    for (int64_t r = 0; r < p->k; r++) {
        if (r + EBB_AHEAD < p->k) {
            __builtin_prefetch(p->table + p->rows[r + EBB_AHEAD] * p->dim);
            __builtin_prefetch(p->table + p->rows[r + EBB_AHEAD] * p->dim + p->dim - 1);
        }
        const float *restrict from = p->table + p->rows[r] * p->dim;
        float *restrict to = p->base + r * p->dim;
        for (int64_t j = 0; j < p->dim; j++) to[j] = from[j];
    }
    return 0;
}

/* Σ a[j]·b[j] over j < r, summed as aten's SumKernel sums a contiguous float32 row of r
 * products on x86 (at every capability: its float vectors are 8 wide there): rows under 8
 * by four interleaved scalar sums; longer ones by 8-lane vector sums (four interleaved
 * from 32 on), then the entries past the last whole vector one by one, then the 8 lanes.
 * Exact for r < 512; beyond, aten adds a cascade and ebb.native.training leaves such
 * ranks to torch. */
EBB_BODY float dot_in_torch_order(const float *restrict a, const float *restrict b, int64_t r) {
    if (r < 8) {
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int64_t i = 0;
        for (; i + 4 <= r; i += 4)
            for (int k = 0; k < 4; k++) part[k] += a[i + k] * b[i + k];
        for (; i < r; i++) part[0] += a[i] * b[i];
        return ((part[0] + part[1]) + part[2]) + part[3];
    }
    const int64_t vectors = r / 8, groups = vectors / 4;
    float part[4][8] = {{0.0f}};
    for (int64_t g = 0; g < groups; g++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 8; l++) part[k][l] += a[(4 * g + k) * 8 + l] * b[(4 * g + k) * 8 + l];
    for (int64_t v = 4 * groups; v < vectors; v++)
        for (int l = 0; l < 8; l++) part[0][l] += a[v * 8 + l] * b[v * 8 + l];
    if (groups)
        for (int k = 1; k < 4; k++)
            for (int l = 0; l < 8; l++) part[0][l] += part[k][l];
    float total = 0.0f;
    for (int64_t i = vectors * 8; i < r; i++) total += a[i] * b[i];
    for (int l = 0; l < 8; l++) total += part[0][l];
    return total;
}

/* A kernel's outcome: done, or refused before the optimiser's state was touched. */
enum { EBB_DONE = 0, EBB_BAD_ROW = 1, EBB_BAD_POSITION = 2 };

/* PMF (ebb.models.pmf): r̂ = μ + b_u + b_i + U_u·V_i, each side's row [rank factors, bias].
 * A row's gradient is the mean of its ratings' (r̂ − r)·(the other side's row, with 1 for
 * the bias), plus l2 × the row; with row_sum (hyper.row_grad sum), their sum plus
 * (count·l2) × the row. *loss = Σ (r̂ − r)². */
EBB_BODY int pmf_step(const ebb_param *restrict user, const ebb_param *restrict item, int64_t rank,
                      const int64_t *restrict user_of, const int64_t *restrict item_of,
                      const float *restrict rating, int64_t n, const float *restrict user_count,
                      const float *restrict item_count, float mu, float l2, int row_sum,
                      const ebb_optim *restrict o, double *restrict loss_out) {
    const int64_t d = user->dim;
    if (gather(user) || gather(item)) return EBB_BAD_ROW;
    for (int64_t j = 0; j < user->k * d; j++) user->delta[j] = 0.0f;
    for (int64_t j = 0; j < item->k * d; j++) item->delta[j] = 0.0f;
    const float *restrict bu = user->base, *restrict bi = item->base;
    float *restrict gu_all = user->delta, *restrict gi_all = item->delta;
    double loss = 0.0;
    for (int64_t q = 0; q < n; q++)
        if ((uint64_t)user_of[q] >= (uint64_t)user->k || (uint64_t)item_of[q] >= (uint64_t)item->k)
            return EBB_BAD_POSITION;
    for (int64_t q = 0; q < n; q++) {
        if (q + EBB_AHEAD < n) { /* the batch's rows outgrow the L2 cache at ML-10M's shape */
            const int64_t u = user_of[q + EBB_AHEAD] * d, i = item_of[q + EBB_AHEAD] * d;
            __builtin_prefetch(bu + u);
            __builtin_prefetch(bu + u + d - 1);
            __builtin_prefetch(bi + i);
            __builtin_prefetch(bi + i + d - 1);
            __builtin_prefetch(gu_all + u, 1);
            __builtin_prefetch(gu_all + u + d - 1, 1);
            __builtin_prefetch(gi_all + i, 1);
            __builtin_prefetch(gi_all + i + d - 1, 1);
        }
        const float *restrict pu = bu + user_of[q] * d, *restrict pi = bi + item_of[q] * d;
        float pred = dot_in_torch_order(pu, pi, rank) + pu[rank];
        pred = pred + pi[rank];
        pred = pred + mu;
        const float e = pred - rating[q];
        loss += (double)(e * e);
        float *restrict gu = gu_all + user_of[q] * d, *restrict gi = gi_all + item_of[q] * d;
        for (int64_t j = 0; j < rank; j++) gu[j] += pi[j] * e;
        for (int64_t j = 0; j < rank; j++) gi[j] += pu[j] * e;
        gu[rank] += e;
        gi[rank] += e;
    }
    const ebb_param *sides[2] = {user, item};
    const float *counts[2] = {user_count, item_count};
    for (int s = 0; s < 2; s++) {
        const ebb_param *p = sides[s];
        for (int64_t r = 0; r < p->k; r++) {
            float *restrict g = p->delta + r * d;
            const float *restrict x = p->base + r * d;
            const float c = counts[s][r];
            prefetch_state(p, r + EBB_AHEAD);
            if (row_sum) { /* torch's g.add_(x * (count * l2)): two roundings, never fused */
                const float lc = c * l2;
                for (int64_t j = 0; j < d; j++) g[j] = g[j] + x[j] * lc;
            } else {
                for (int64_t j = 0; j < d; j++) g[j] = axpy(o, g[j] / c, l2, x[j]);
            }
            optimise_row(o, p, r);
        }
    }
    *loss_out = reported_loss(loss);
    return EBB_DONE;
}

/* A sample's contribution to the loss and its gradient (σ(x) − y)/n: torch's
 * 1/(1 + e^−x), and log(1 + e^−x) + (1 − y)·x (past x = −80, log(1 + e^−x) is −x in float32). */
EBB_BODY float logistic(float x, float y, float count, double *restrict loss) {
    const float e = expf(-x);
    *loss += (double)(x < -80.0f ? -x : log1pf(e)) + (1.0 - (double)y) * (double)x;
    return (1.0f / (1.0f + e) - y) / count;
}

enum { EBB_NOT_CSR = -1 }; /* (sparse_lr_csr's: the other order's pass must do it) */

/* Sparse LR's gradients in one pass over a batch whose non-zeros come sample by sample,
 * in order (CSR, as to_batch makes them): a sample's logit, its gradient (σ(x) − y)/n,
 * then its non-zeros' gradients while they are in the L1 cache. The same additions in the
 * same order as torch's two index_add_ passes. gw: [kf] zeros in, Σ (σ − y)/n · x out. */
EBB_BODY int sparse_lr_csr(const float *restrict w, int64_t kf, float b, const int64_t *restrict feature_of,
                           const int64_t *restrict sample_of, const float *restrict values, int64_t nnz,
                           const float *restrict label, int64_t n, float *restrict gw, double *restrict loss,
                           double *restrict g_bias) {
    int64_t q = 0;
    for (int64_t s = 0; s < n; s++) {
        const int64_t first = q;
        float sum = 0.0f;
        for (; q < nnz && sample_of[q] == s; q++) {
            if ((uint64_t)feature_of[q] >= (uint64_t)kf) return EBB_BAD_POSITION;
            sum += w[feature_of[q]] * values[q];
        }
        if (q < nnz && sample_of[q] < s) return EBB_NOT_CSR;
        const float g = logistic(sum + b, label[s], (float)n, loss);
        *g_bias += (double)g;
        for (int64_t i = first; i < q; i++) gw[feature_of[i]] += g * values[i];
    }
    return q < nnz ? EBB_BAD_POSITION : EBB_DONE;
}

/* The same for non-zeros in any order, in torch's two passes; `logit`: n floats of scratch. */
EBB_BODY int sparse_lr_any_order(const float *restrict w, int64_t kf, float b, const int64_t *restrict feature_of,
                                 const int64_t *restrict sample_of, const float *restrict values, int64_t nnz,
                                 const float *restrict label, int64_t n, float *restrict gw, double *restrict loss,
                                 double *restrict g_bias, float *restrict logit) {
    for (int64_t i = 0; i < nnz; i++)
        if ((uint64_t)feature_of[i] >= (uint64_t)kf || (uint64_t)sample_of[i] >= (uint64_t)n) return EBB_BAD_POSITION;
    for (int64_t s = 0; s < n; s++) logit[s] = 0.0f;
    for (int64_t i = 0; i < nnz; i++) logit[sample_of[i]] += w[feature_of[i]] * values[i];
    for (int64_t s = 0; s < n; s++) {
        logit[s] = logistic(logit[s] + b, label[s], (float)n, loss);
        *g_bias += (double)logit[s];
    }
    for (int64_t i = 0; i < nnz; i++) gw[feature_of[i]] += logit[sample_of[i]] * values[i];
    return EBB_DONE;
}

/* Sparse LR (ebb.models.logistic): logit = Σ w_f·x_f + b over a sample's non-zeros;
 * the gradient is the mean of (σ(logit) − y)·x, plus l2 × w for the weights (not the
 * bias). With `last` (hyper.l2_every_step; NULL: off) a feature's l2 is l2_d × the steps
 * since it was last touched, now − last[f], rounded to float32 as the torch path rounds it,
 * and last[f] becomes now. `scratch` holds n floats. *loss = Σ the samples' binary
 * cross-entropy. */
EBB_BODY int sparse_lr_step(const ebb_param *restrict weight, const ebb_param *restrict bias,
                            const int64_t *restrict feature_of, const int64_t *restrict sample_of,
                            const float *restrict values, int64_t nnz, const float *restrict label, int64_t n,
                            float l2, double *restrict last, double l2_d, double now, float *restrict scratch,
                            const ebb_optim *restrict o, double *restrict loss_out) {
    if (gather(weight) || gather(bias)) return EBB_BAD_ROW;
    const int64_t kf = weight->k;
    const float *restrict w = weight->base;
    float *restrict gw = weight->delta;
    const float b = bias->base[0];
    double loss = 0.0, g_bias = 0.0;
    for (int64_t r = 0; r < kf; r++) gw[r] = 0.0f;
    int outcome = sparse_lr_csr(w, kf, b, feature_of, sample_of, values, nnz, label, n, gw, &loss, &g_bias);
    if (outcome == EBB_NOT_CSR) {
        loss = g_bias = 0.0;
        for (int64_t r = 0; r < kf; r++) gw[r] = 0.0f;
        outcome = sparse_lr_any_order(w, kf, b, feature_of, sample_of, values, nnz, label, n, gw, &loss, &g_bias,
                                      scratch);
    }
    if (outcome != EBB_DONE) return outcome;
    if (last) { /* torch's g.add_(w * l2_rows): two roundings, never fused */
        for (int64_t r = 0; r < kf; r++) {
            const int64_t f = weight->rows[r];
            const float l2_r = (float)((-last[f] + now) * l2_d);
            last[f] = now;
            gw[r] = gw[r] + w[r] * l2_r;
        }
    } else {
        for (int64_t r = 0; r < kf; r++) gw[r] = axpy(o, gw[r], l2, w[r]);
    }
    if (o->kind == EBB_ADAM && !weight->row_steps) {
        adam_scalar_rows(o, weight);
    } else {
        for (int64_t r = 0; r < kf; r++) {
            prefetch_state(weight, r + EBB_AHEAD);
            optimise_row(o, weight, r);
        }
    }
    bias->delta[0] = (float)g_bias;
    optimise_row(o, bias, 0);
    *loss_out = reported_loss(loss);
    return EBB_DONE;
}

/* table[rows] += scale · vals ([k][dim]), as torch's index_add_ rounds it (axpy); the rows
 * unique. Returns EBB_BAD_ROW, having written nothing, when a row is not in the table. */
EBB_BODY int add_rows(float *restrict table, int64_t n_rows, int64_t dim, const int64_t *restrict rows, int64_t k,
                      const float *restrict vals, float scale, const ebb_optim *restrict o) {
    for (int64_t r = 0; r < k; r++)
        if ((uint64_t)rows[r] >= (uint64_t)n_rows) return EBB_BAD_ROW;
    if (dim == 1) { /* (a weight vector: its rows are sorted, the hardware prefetches them) */
        for (int64_t r = 0; r < k; r++) table[rows[r]] = axpy(o, table[rows[r]], scale, vals[r]);
        return EBB_DONE;
    }
    for (int64_t r = 0; r < k; r++) {
        if (r + EBB_AHEAD < k) {
            __builtin_prefetch(table + rows[r + EBB_AHEAD] * dim, 1);
            __builtin_prefetch(table + rows[r + EBB_AHEAD] * dim + dim - 1, 1);
        }
        float *restrict t = table + rows[r] * dim;
        const float *restrict v = vals + r * dim;
        for (int64_t j = 0; j < dim; j++) t[j] = axpy(o, t[j], scale, v[j]);
    }
    return EBB_DONE;
}

/* Each kernel twice: portable C, and on x86-64 for CPUs with AVX2 and FMA (the vector
 * loops 8 floats wide, fmaf one instruction), chosen at run time. Both give the same bits. */
int ebb_simd_enabled(void); /* kernels.c */

#if defined(__x86_64__)
#define EBB_DISPATCH(name, params, args)                                                    \
    __attribute__((target("avx2,fma"))) static int name##_avx2 params { return name args; } \
    static int name##_portable params { return name args; }                                 \
    static int name##_any params {                                                          \
        if (ebb_simd_enabled() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) \
            return name##_avx2 args;                                                        \
        return name##_portable args;                                                        \
    }
#else
#define EBB_DISPATCH(name, params, args) \
    static int name##_any params { return name args; }
#endif

/* PMF at the default rank (20, MLLess's) has a copy of its own, its loops' lengths known
 * to the compiler (unrolled, no remainder loops). */
EBB_BODY int pmf_step_ranked(const ebb_param *u, const ebb_param *i, int64_t rank, const int64_t *uo,
                             const int64_t *io, const float *y, int64_t n, const float *uc, const float *ic, float mu,
                             float l2, int sum, const ebb_optim *o, double *loss) {
    if (rank == 20) return pmf_step(u, i, 20, uo, io, y, n, uc, ic, mu, l2, sum, o, loss);
    return pmf_step(u, i, rank, uo, io, y, n, uc, ic, mu, l2, sum, o, loss);
}

EBB_DISPATCH(pmf_step_ranked,
             (const ebb_param *u, const ebb_param *i, int64_t rank, const int64_t *uo, const int64_t *io,
              const float *y, int64_t n, const float *uc, const float *ic, float mu, float l2, int sum,
              const ebb_optim *o, double *loss),
             (u, i, rank, uo, io, y, n, uc, ic, mu, l2, sum, o, loss))
EBB_DISPATCH(sparse_lr_step,
             (const ebb_param *w, const ebb_param *b, const int64_t *fo, const int64_t *so, const float *x,
              int64_t nnz, const float *y, int64_t n, float l2, double *last, double l2_d, double now, float *scratch,
              const ebb_optim *o, double *loss),
             (w, b, fo, so, x, nnz, y, n, l2, last, l2_d, now, scratch, o, loss))
EBB_DISPATCH(add_rows,
             (float *t, int64_t n_rows, int64_t dim, const int64_t *rows, int64_t k, const float *v, float scale,
              const ebb_optim *o),
             (t, n_rows, dim, rows, k, v, scale, o))

/* One PMF step: user and item hold the replica's tables and the batch's unique rows;
 * user_of / item_of [n] say which of those rows each rating has, user_count / item_count
 * how many ratings each row has; row_sum: a row's gradient sums its ratings' (else their mean).
 * Writes each side's base and delta [k][rank + 1], advances
 * the optimiser's state of those rows, and sets *loss = Σ (r̂ − r)². Returns EBB_DONE, or
 * EBB_BAD_ROW / EBB_BAD_POSITION (a row not in its table, a position not among the rows)
 * with the optimiser's state untouched. */
int ebb_pmf_step(const ebb_param *user, const ebb_param *item, int64_t rank, const int64_t *user_of,
                 const int64_t *item_of, const float *rating, int64_t n, const float *user_count,
                 const float *item_count, float mu, float l2, int row_sum, const ebb_optim *opt, double *loss) {
    return pmf_step_ranked_any(user, item, rank, user_of, item_of, rating, n, user_count, item_count, mu, l2, row_sum,
                               opt, loss);
}

/* One sparse LR step on a CSR batch: weight holds the weight table [F][1] and the batch's
 * unique features; feature_of / sample_of [nnz] say which of them and which sample each
 * non-zero has; bias is the [1][1] table with its one row; last (or NULL) the step each
 * feature was last touched, [F], now the current step (see sparse_lr_step). Writes both bases and deltas,
 * advances the optimiser's state of those rows and sets *loss = Σ log-loss. Returns as
 * ebb_pmf_step. */
int ebb_sparse_lr_step(const ebb_param *weight, const ebb_param *bias, const int64_t *feature_of,
                       const int64_t *sample_of, const float *values, int64_t nnz, const float *label, int64_t n,
                       float l2, double *last, double l2_d, double now, float *scratch, const ebb_optim *opt,
                       double *loss) {
    return sparse_lr_step_any(weight, bias, feature_of, sample_of, values, nnz, label, n, l2, last, l2_d, now, scratch,
                              opt, loss);
}

/* table[rows] += scale · vals for a float32 table [n_rows][dim] and unique rows [k]; only
 * opt's fused_axpy is read. Returns EBB_DONE, or EBB_BAD_ROW having written nothing. */
int ebb_add_rows(float *table, int64_t n_rows, int64_t dim, const int64_t *rows, int64_t k, const float *vals,
                 float scale, const ebb_optim *opt) {
    return add_rows_any(table, n_rows, dim, rows, k, vals, scale, opt);
}
