// Remote paging: EDM's DM-Handler on userfaultfd, with an eviction worker and page stores.
export { RemotePager, type RemotePagerOptions, type RemotePagingStats } from './pager.js';
export { EmbeddedStore, encodePage, decodePage, type PageStore, type StoredPage } from './store.js';
export { RedisStore, type RedisStoreOptions } from './redis-store.js';
export type { DirtyTracking, LatencySummary } from './dm-handler.js';
