// `pagefault-rdma atomic-lat`: RDMA atomic latency between two processes or hosts over libfabric (perftest's ib_atomic_lat: -A, columns).
import { perftestProgram } from '../fabric-programs.js';

export default perftestProgram('atomic-lat', 'atomic', 'lat', 'RDMA atomic (FETCH_AND_ADD / CMP_AND_SWAP) latency');
