// The completer's status table for faults that cannot be resolved: which DMA status a
// transfer ends with for each SMMU event, at the source (a read) and at the destination (a
// write), including an event the table does not name.
import { describe, expect, test } from 'vitest';
import { DmaStatus, EvtId } from '../../../kernel-sim/index.js';
import { statusForFault } from '../../../kernel-sim/rc/faults.js';

describe('statusForFault', () => {
  test('each unrecoverable event has a status per side', () => {
    expect(statusForFault(EvtId.F_ADDR_SIZE, 'read')).toBe(DmaStatus.SRC_ADDR_ERR);
    expect(statusForFault(EvtId.F_ADDR_SIZE, 'write')).toBe(DmaStatus.DST_ADDR_ERR);
    expect(statusForFault(EvtId.F_PERMISSION, 'read')).toBe(DmaStatus.SRC_PERM_ERR);
    expect(statusForFault(EvtId.F_PERMISSION, 'write')).toBe(DmaStatus.DST_PERM_ERR);
    expect(statusForFault(EvtId.C_BAD_STREAMID, 'read')).toBe(DmaStatus.PD_ERR);
    expect(statusForFault(EvtId.C_BAD_STREAMID, 'write')).toBe(DmaStatus.PD_ERR);
  });

  test('an event the table does not name is an address error of the side that faulted', () => {
    expect(statusForFault(EvtId.F_TRANSLATION, 'read')).toBe(DmaStatus.SRC_ADDR_ERR);
    expect(statusForFault(EvtId.F_TRANSLATION, 'write')).toBe(DmaStatus.DST_ADDR_ERR);
  });
});
