// Remote paging: EDM's DM-Handler on userfaultfd, with an eviction worker and page stores.
export { RemotePager, type RemotePagerOptions, type RemotePagingStats } from './pager.js';
export { EmbeddedStore, encodePage, decodePage, type PageIdentity, type PageStore, type StoredPage } from './store.js';
export { RedisStore, type RedisStoreOptions } from './redis-store.js';
export { MemoryServer, type MemoryServerOptions, type MemoryServerStats, type MemoryServerTraceEvent } from './memory-server.js';
export { MemoryServerStore, type MemoryServerStoreOptions } from './memory-server-store.js';
export type { CloseResult, DirtyTracking, DmTraceEvent, LatencySummary } from './dm-handler.js';
