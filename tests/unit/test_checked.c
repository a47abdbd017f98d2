/* The overflow-checked arithmetic every parser of a source's sizes, offsets, strides and counts
 * uses: exact results up to 2^64 - 1, refusal one past it, never a wrapped value. The cases are
 * the ones hostile sources use: a storage offset near 2^63, a stride near 2^57, a chunk of
 * [2^58, 64] elements. */
#include <stdint.h>

#include "ckptfs/checked.h"
#include "tap.h"

#define U64_MAX UINT64_MAX
#define P63 (1ull << 63)

static void test_add_mul(void)
{
    uint64_t r = 0;
    tap_ok(ckptfs_add_u64(U64_MAX - 1, 1, &r) && r == U64_MAX, "add: 2^64 - 2 + 1 fits");
    tap_ok(!ckptfs_add_u64(U64_MAX, 1, &r), "add: 2^64 - 1 + 1 is refused");
    tap_ok(!ckptfs_add_u64(P63, P63, &r), "add: 2^63 + 2^63 is refused");
    tap_ok(ckptfs_mul_u64(1ull << 32, (1ull << 32) - 1, &r) && r == U64_MAX - ((1ull << 32) - 1),
           "mul: 2^32 x (2^32 - 1) fits");
    tap_ok(!ckptfs_mul_u64(1ull << 32, 1ull << 32, &r), "mul: 2^32 x 2^32 is refused");
    tap_ok(!ckptfs_mul_u64(P63, 2, &r), "mul: 2^63 x 2 (a bf16 offset near 2^63) is refused");
    tap_ok(ckptfs_mul_u64(0, U64_MAX, &r) && r == 0, "mul: 0 x anything is 0");
}

static void test_offset_at(void)
{
    uint64_t r = 0;
    tap_ok(ckptfs_offset_at(100, 3, 8, &r) && r == 124, "offset_at: 100 + 3 x 8 = 124");
    tap_ok(!ckptfs_offset_at(0, 4096, 1ull << 57, &r), "offset_at: row 4096 of stride 2^57 is refused");
    tap_ok(!ckptfs_offset_at(U64_MAX - 7, 1, 8, &r), "offset_at: the addition overflowing is refused");
    tap_ok(ckptfs_offset_at(U64_MAX - 8, 1, 8, &r) && r == U64_MAX, "offset_at: up to 2^64 - 1 exactly");
}

static void test_dims(void)
{
    uint64_t r = 0;
    tap_ok(ckptfs_dims_product(NULL, 0, &r) && r == 1, "dims: a scalar has 1 element");
    const uint64_t ok_dims[] = {1ull << 20, 1ull << 20, 1ull << 23};
    tap_ok(ckptfs_dims_product(ok_dims, 3, &r) && r == 1ull << 63, "dims: [2^20, 2^20, 2^23] = 2^63");
    const uint64_t chunk[] = {1ull << 58, 64}; /* the .metadata chunk that wrapped to 0 */
    tap_ok(!ckptfs_dims_product(chunk, 2, &r), "dims: [2^58, 64] (2^64 elements) is refused, not 0");
    const uint64_t wrap_to_small[] = {(1ull << 62) + 1, 4}; /* 2^64 + 4 -> 4 when wrapped */
    tap_ok(!ckptfs_dims_product(wrap_to_small, 2, &r), "dims: [2^62 + 1, 4] is refused, not 4");
    const uint64_t empty[] = {0, 5};
    tap_ok(ckptfs_dims_product(empty, 2, &r) && r == 0, "dims: an empty dimension gives 0");
}

static void test_elements_end(void)
{
    uint64_t r = 0;
    tap_ok(ckptfs_elements_end(10, 6, 2, &r) && r == 32, "elements_end: (10 + 6) x 2 = 32");
    /* The torch_dist chunk whose check `(offset + numel) * isz > size` passed: 2^64 -> 0. */
    tap_ok(!ckptfs_elements_end(P63 - 64, 64, 2, &r), "elements_end: (2^63 - 64 + 64) x 2 is refused");
    tap_ok(!ckptfs_elements_end(U64_MAX, 1, 1, &r), "elements_end: the sum overflowing is refused");
    tap_ok(ckptfs_elements_end(P63 - 64, 64, 1, &r) && r == P63, "elements_end: exact at 2^63");
}

static void test_rows_end(void)
{
    uint64_t r = 0;
    tap_ok(ckptfs_rows_end(4, 3, 10, 5, 2, &r) && r == (4 + 2 * 10 + 5) * 2,
           "rows_end: (4 + 2 x 10 + 5) x 2");
    tap_ok(ckptfs_rows_end(4, 0, U64_MAX, 5, 2, &r) && r == 8, "rows_end: no rows ends at the offset");
    tap_ok(ckptfs_rows_end(4, 7, U64_MAX, 0, 2, &r) && r == 8, "rows_end: no columns ends at the offset");
    tap_ok(ckptfs_rows_end(4, 1, U64_MAX, 5, 2, &r) && r == 18, "rows_end: one row ignores the stride");
    /* The Megatron rank tensor whose old check passed: 64 bf16 elements, stride ~2^57, storage
     * offset 7: (7 + 63 x stride + 1) x 2 = 2^64, which wrapped to 0. */
    uint64_t stride = (P63 - 2) / 63;
    tap_ok(!ckptfs_rows_end(7, 64, stride, 1, 2, &r), "rows_end: stride %llu x 64 bf16 rows is refused",
           (unsigned long long)stride);
    tap_ok(ckptfs_rows_end(7, 64, stride, 1, 1, &r) && r == P63, "rows_end: the same in bytes is 2^63");
    tap_ok(!ckptfs_rows_end(0, 4096, 1ull << 57, 4096, 4, &r), "rows_end: 4096 rows of stride 2^57 refused");
}

/* torch's count of the storage elements a strided tensor reaches (computeStorageNbytes). */
static void test_strided_extent(void)
{
    uint64_t r = 0;
    const uint64_t shape[] = {61, 64}, stride[] = {64, 1};
    tap_ok(ckptfs_strided_extent(0, shape, stride, 2, &r) && r == 61 * 64, "strided_extent: [61, 64] row-major");
    tap_ok(ckptfs_strided_extent(5, shape, stride, 2, &r) && r == 5 + 61 * 64, "strided_extent: from offset 5");
    const uint64_t wide[] = {3, 4}, wide_stride[] = {10, 1};
    tap_ok(ckptfs_strided_extent(0, wide, wide_stride, 2, &r) && r == 2 * 10 + 4,
           "strided_extent: rows 10 apart end at the last row's last element");
    const uint64_t empty[] = {0, 64}, huge_stride[] = {U64_MAX, U64_MAX};
    tap_ok(ckptfs_strided_extent(U64_MAX, empty, huge_stride, 2, &r) && r == 0,
           "strided_extent: no element reaches nothing, whatever the offset and strides");
    tap_ok(ckptfs_strided_extent(9, NULL, NULL, 0, &r) && r == 10, "strided_extent: a scalar is one element");
    const uint64_t two[] = {2}, half[] = {P63};
    tap_ok(ckptfs_strided_extent(0, two, half, 1, &r) && r == P63 + 1, "strided_extent: 2 elements 2^63 apart");
    tap_ok(!ckptfs_strided_extent(P63, two, half, 1, &r), "strided_extent: past 2^64 refused");
}

static void test_range_inside(void)
{
    tap_ok(ckptfs_range_inside(0, 0, 0), "range_inside: empty at 0 of an empty file");
    tap_ok(ckptfs_range_inside(10, 0, 10), "range_inside: empty at the end");
    tap_ok(ckptfs_range_inside(4, 6, 10), "range_inside: up to the end");
    tap_ok(!ckptfs_range_inside(4, 7, 10), "range_inside: one byte past the end");
    tap_ok(!ckptfs_range_inside(11, 0, 10), "range_inside: starting past the end");
    tap_ok(!ckptfs_range_inside(1, U64_MAX, U64_MAX), "range_inside: a length that wraps the sum");
    tap_ok(!ckptfs_range_inside(U64_MAX, 2, 100), "range_inside: an offset that wraps the sum");
}

int main(void)
{
    test_add_mul();
    test_offset_at();
    test_dims();
    test_elements_end();
    test_rows_end();
    test_strided_extent();
    test_range_inside();
    return tap_done();
}
