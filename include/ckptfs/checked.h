/* Overflow-checked arithmetic for every size, offset, stride and element count taken from a
 * source file. Sources are hostile input: a sum or product that does not fit in 64 bits must be
 * refused, never wrapped, or a bounds check such as `(offset + numel) * itemsize <= size` passes
 * for a range that lies elsewhere. Each function returns false on overflow (*OUT is then
 * unspecified) and true with the exact result otherwise. */
#ifndef CKPTFS_CHECKED_H
#define CKPTFS_CHECKED_H

#include <stdbool.h>
#include <stdint.h>

static inline bool ckptfs_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

static inline bool ckptfs_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

/* BASE + INDEX * STRIDE: where row INDEX starts, STRIDE bytes apart. */
static inline bool ckptfs_offset_at(uint64_t base, uint64_t index, uint64_t stride, uint64_t *out)
{
    uint64_t step;
    return ckptfs_mul_u64(index, stride, &step) && ckptfs_add_u64(base, step, out);
}

/* The product of N dimensions (1 for a scalar): an element count. */
static inline bool ckptfs_dims_product(const uint64_t *dims, unsigned n, uint64_t *out)
{
    uint64_t p = 1;
    for (unsigned i = 0; i < n; i++)
        if (!ckptfs_mul_u64(p, dims[i], &p))
            return false;
    *out = p;
    return true;
}

/* (OFFSET + NUMEL) * ITEM_SIZE: the end, in bytes, of NUMEL contiguous elements that start at
 * element OFFSET of a storage. */
static inline bool ckptfs_elements_end(uint64_t offset, uint64_t numel, uint64_t item_size,
                                       uint64_t *end_bytes)
{
    uint64_t end;
    return ckptfs_add_u64(offset, numel, &end) && ckptfs_mul_u64(end, item_size, end_bytes);
}

/* The end, in bytes, of ROWS rows of COLS adjacent elements, row r starting at element
 * OFFSET + r * ROW_STEP: (OFFSET + (ROWS - 1) * ROW_STEP + COLS) * ITEM_SIZE, or OFFSET *
 * ITEM_SIZE when there is no element at all. */
static inline bool ckptfs_rows_end(uint64_t offset, uint64_t rows, uint64_t row_step,
                                   uint64_t cols, uint64_t item_size, uint64_t *end_bytes)
{
    uint64_t last_row, end = offset;
    if (rows > 0 && cols > 0 &&
        (!ckptfs_offset_at(offset, rows - 1, row_step, &last_row) ||
         !ckptfs_add_u64(last_row, cols, &end)))
        return false;
    return ckptfs_mul_u64(end, item_size, end_bytes);
}

/* The elements of a storage a strided tensor of N dims reaches, as torch counts them when it
 * rebuilds one (computeStorageNbytes): OFFSET + 1 + sum((SHAPE[i] - 1) * STRIDE[i]), or 0 when
 * the tensor has no element. */
static inline bool ckptfs_strided_extent(uint64_t offset, const uint64_t *shape, const uint64_t *stride,
                                         unsigned n, uint64_t *out)
{
    uint64_t end = 1;
    for (unsigned i = 0; i < n; i++)
        if (shape[i] == 0) {
            *out = 0;
            return true;
        }
    for (unsigned i = 0; i < n; i++)
        if (!ckptfs_offset_at(end, shape[i] - 1, stride[i], &end))
            return false;
    return ckptfs_add_u64(end, offset, out);
}

/* Whether [OFFSET, OFFSET + LEN) lies inside [0, SIZE), without wrapping. */
static inline bool ckptfs_range_inside(uint64_t offset, uint64_t len, uint64_t size)
{
    return offset <= size && len <= size - offset;
}

#endif
