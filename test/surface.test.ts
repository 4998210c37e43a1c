// The public surface: the two entry points list what they export, so an engine internal never
// becomes API by being exported from its own module.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { expect, test } from 'vitest';
import * as kernelSim from '../kernel-sim/index.js';
import * as lib from '../lib/index.js';
import { ROOT } from './child.js';

test('the entry points and the folders they list export by name, never with export *', () => {
  for (const f of ['lib/index.ts', 'lib/verbs/index.ts', 'lib/remote-paging/index.ts', 'kernel-sim/index.ts', 'kernel-sim/pldma/pldma.ts'])
    expect(readFileSync(join(ROOT, f), 'utf8'), f).not.toMatch(/^export \*/m);
});

test('engine internals and shared helpers stay off the public surface', () => {
  const internals = [
    'walkCost',
    'walkedCost',
    'stallDelay',
    'traceTransfer',
    'RUNS_IN_FLIGHT',
    'MAX_RUN_BLOCKS',
    'INLINE_COPY_MAX',
    'INLINE_SAME_TURN',
    'MAX_WIRE_BYTES',
    'ModelResource',
    'realNowUs',
    'linkArrival',
    'checkSystemOptions',
    'releaseForeignFault',
  ];
  for (const name of internals) expect(Object.keys(kernelSim), name).not.toContain(name);
  for (const name of ['verbsError', 'knownAccess', 'encodePage', 'decodePage']) expect(Object.keys(lib), name).not.toContain(name);
  // What the programs and README build on is still there.
  for (const name of ['SimSystem', 'Pldma', 'Smmu', 'SmmuDriver', 'LibfabricTransport', 'DmaStatus', 'encodeEvent', 'DEFAULT_COSTS'])
    expect(Object.keys(kernelSim), name).toContain(name);
  for (const name of ['Cluster', 'connectQps', 'WcStatus', 'RemotePager', 'EmbeddedStore', 'mapRegion', 'Userfaultfd', 'FaultLibrary'])
    expect(Object.keys(lib), name).toContain(name);
});
