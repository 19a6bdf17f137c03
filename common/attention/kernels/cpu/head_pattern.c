/* The heads-interleaved CSR pattern of edges sorted by row (graphattn/aggregate.py, HeadPattern: multi-head
 * attention's weighted sums over target-sorted edges as one sparse product). Row r * heads + h holds the edges q
 * of row r (ptr[r] <= q < ptr[r + 1]) in order, at columns cols[q] * heads + h, each taking the weight
 * value_index = order[q] * heads + h of the [edges, heads] weights (order NULL: q itself); with `inverse`,
 * inverse[q * heads + h] is that non-zero's position. One pass over the rows (OpenMP), 32-bit indices.
 */
#include <stdint.h>

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
