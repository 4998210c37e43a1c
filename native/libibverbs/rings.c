/* The rings the device made, as the provider maps them (docs/device-abi.md §2): the memfd
 * mapped shared, each ring's geometry read once and checked. */
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include "provider.h"

int pfr_ring_map(int fd, size_t size, void **map)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int err = p == MAP_FAILED ? errno : 0;
	close(fd);
	*map = err ? NULL : p;
	return err;
}

/* The ring whose header is at `offset` of the mapping: its geometry copied and checked against
 * the mapping's size, so no index the provider computes can leave it. */
int pfr_ring_attach(struct pfr_ring *r, void *map, size_t map_size, uint64_t offset, uint16_t kind)
{
	struct pfr_queue_buf *q;
	if (offset > map_size || map_size - offset < sizeof(*q))
		return EIO;
	q = (struct pfr_queue_buf *)((char *)map + offset);
	if (q->magic != PFR_QUEUE_MAGIC || q->abi_version != PFR_ABI_VERSION || q->kind != kind || q->log2_elem_size > 16 ||
	    q->num_elems == 0 || (q->num_elems & (q->num_elems - 1)) || q->index_mask != q->num_elems - 1 ||
	    (uint64_t)q->num_elems << q->log2_elem_size > map_size - offset - PFR_QUEUE_DATA_OFFSET)
		return EIO;
	r->buf = q;
	r->num_elems = q->num_elems;
	r->log2_elem_size = q->log2_elem_size;
	return 0;
}
