/* Objects by the device's handle, per context: an array indexed by handle (the device hands
 * handles out one after another, so it stays as long as the objects ever made). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "provider.h"

int pfr_table_set(struct pfr_table *t, uint32_t handle, void *obj)
{
	if (handle >= t->size) {
		uint32_t size = t->size ? t->size : 16;
		void **slots;
		while (size <= handle) {
			if (size > UINT32_MAX / 2)
				return ENOMEM;
			size *= 2;
		}
		slots = realloc(t->slots, sizeof(void *) * size);
		if (!slots)
			return ENOMEM;
		memset(slots + t->size, 0, sizeof(void *) * (size - t->size));
		t->slots = slots;
		t->size = size;
	}
	t->slots[handle] = obj;
	return 0;
}

void *pfr_table_get(struct pfr_table *t, uint32_t handle)
{
	return handle < t->size ? t->slots[handle] : NULL;
}

void pfr_table_clear(struct pfr_table *t, uint32_t handle)
{
	if (handle < t->size)
		t->slots[handle] = NULL;
}

void pfr_table_free(struct pfr_table *t)
{
	free(t->slots);
	t->slots = NULL;
	t->size = 0;
}
