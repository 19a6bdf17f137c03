/* The sparse patterns of graphattn/aggregate.py (multi-head attention's weighted sums over target-sorted edges
 * as one sparse product), in one pass each.
 *
 * head_pattern: the heads-interleaved CSR pattern of edges sorted by row. Row r * heads + h holds the edges q
 * of row r (ptr[r] <= q < ptr[r + 1]) in order, at columns cols[q] * heads + h, each taking the weight
 * value_index = order[q] * heads + h of the [edges, heads] weights (order NULL: q itself); with `inverse`,
 * inverse[q * heads + h] is that non-zero's position. OpenMP over the rows, 32-bit indices.
 *
 * counting_sort: the stable order of n keys in [0, bins) (order[i]: the position of the i-th smallest, ties
 * in their order) and the CSR pointer of the sorted keys (ptr[b]: where bin b starts; ptr[bins] = n).
 */
#include <stdint.h>
#include <string.h>

void head_pattern(const int64_t *ptr, const int64_t *cols, const int64_t *order, int64_t rows, int heads,
                  int32_t *crow, int32_t *col, int32_t *value_index, int32_t *inverse, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t first = ptr[r], degree = ptr[r + 1] - first;
        int64_t p = heads * first;
        for (int h = 0; h < heads; ++h) {
            crow[r * heads + h] = (int32_t)p;
            for (int64_t q = first; q < first + degree; ++q, ++p) {
                col[p] = (int32_t)(cols[q] * heads + h);
                value_index[p] = (int32_t)((order ? order[q] : q) * heads + h);
                if (inverse) inverse[q * heads + h] = (int32_t)p;
            }
        }
    }
    crow[rows * heads] = (int32_t)(heads * ptr[rows]);
}

void counting_sort(const int64_t *keys, int64_t n, int64_t bins, int64_t *ptr, int64_t *order) {
    memset(ptr, 0, sizeof(int64_t) * (bins + 1));
    for (int64_t i = 0; i < n; ++i) ++ptr[keys[i] + 1];
    for (int64_t b = 0; b < bins; ++b) ptr[b + 1] += ptr[b];
    for (int64_t i = 0; i < n; ++i) order[ptr[keys[i]]++] = i; /* ptr[b]: then where bin b ends */
    memmove(ptr + 1, ptr, sizeof(int64_t) * bins);
    ptr[0] = 0;
}
