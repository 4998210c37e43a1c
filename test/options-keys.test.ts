// Every public options object refuses a key it does not know, naming it and the known ones
// (TypeScript catches a typo at compile time; a JavaScript caller gets the same at run time).
import { afterEach, expect, test } from 'vitest';
import { Cluster, mapRegion, RemotePager, touch, Userfaultfd } from '../lib/index.js';
import { closeAll, createPlayers, region, thrown } from './verbs/helpers.js';

afterEach(closeAll);

const bad = (o: object) => o as never;

test('Cluster.create({ node: 4 }) is an error naming node and nodes, not a silent 2-node cluster', () => {
  const e = thrown(() => Cluster.create(bad({ node: 4 })));
  expect(e.code).toBe('ERR_INVALID_ARG_VALUE');
  expect(e.message).toMatch(/unknown option 'node'/);
  expect(e.message).toMatch(/nodes/);
});

test('the verbs options refuse unknown keys: openDevice, regMr, regMrEx, createCq, createQp(Ex), modify, createAh, createSrq, next, getCqEvent', async () => {
  const { cluster, client } = createPlayers();
  const { ctx, pd, cq, qp, region: r } = client;
  const cases: Array<[string, () => unknown]> = [
    ['openDevice', () => cluster.openDevice(0, bad({ defaultPolicys: 'touch' }))],
    ['regMr', () => ctx.regMr(pd, r, 0, 4096, 1, bad({ polcy: 'touch' }))],
    ['regMrEx', () => ctx.regMrEx(pd, bad({ addr: r, length: 4096, access: 1, lenght: 1 }))],
    ['createCq', () => ctx.createCq(4, bad({ chanel: undefined }))],
    ['createQp', () => ctx.createQp(pd, bad({ sendCq: cq, recvCq: cq, caps: {} }))],
    ['createQpEx', () => ctx.createQpEx(pd, bad({ sendCq: cq, recvCq: cq, sendOpsFlags: 1, sendOpFlags: 1 }))],
    ['modify', () => qp.modify(bad({ qpstate: 2 }))],
    ['createAh', () => ctx.createAh(pd, bad({ dlid: 1, port: 1 }))],
    ['createSrq', () => ctx.createSrq(pd, bad({ maxWr: 4, max_sge: 1 }))],
    ['next', () => cq.next(bad({ timeout: 5 }))],
  ];
  for (const [what, fn] of cases) {
    const e = thrown(fn);
    expect(e.code, what).toBe('ERR_INVALID_ARG_VALUE');
    expect(e.message, what).toMatch(/unknown option '\w+' \(the options are /);
  }
  const ch = ctx.createCompChannel();
  await expect(Promise.resolve().then(() => ch.getCqEvent(bad({ timeout: 1 })))).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_VALUE' });
});

test('mapRegion, Userfaultfd.open, register, touch and RemotePager.create refuse unknown keys', async () => {
  expect(thrown(() => mapRegion(4096, bad({ share: true }))).message).toMatch(/unknown option 'share'.*shared/);
  expect(thrown(() => Userfaultfd.open(bad({ timeout: 5 }))).message).toMatch(/unknown option 'timeout'.*timeoutMs/);
  const r = region(4096);
  const u = Userfaultfd.open();
  try {
    expect(thrown(() => u.register(r, bad({ missng: true }))).message).toMatch(/unknown option 'missng'/);
  } finally {
    u.close();
  }
  await expect(touch(r, bad({ lenght: 1 }))).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_VALUE' });
  await expect(Promise.resolve().then(() => RemotePager.create(bad({ size: 4096, residentLimt: 1 })))).rejects.toThrow(
    /unknown option 'residentLimt'/,
  );
});

test("Userfaultfd's per-call options refuse unknown keys before any ioctl: copy, move, zeropage, continue, poison, writeProtect, dirtyPages, unregister", () => {
  const r = region(2 * 4096);
  const staging = region(4096);
  const u = Userfaultfd.open();
  try {
    u.register(r);
    u.register(staging);
    const page = new Uint8Array(4096).fill(7);
    const cases: Array<[string, RegExp, () => unknown]> = [
      [
        'copy',
        /copy: options: unknown option 'writeprotect' \(the options are wake, length, writeProtect\)/,
        () => u.copy(r, 0, page, bad({ writeprotect: true })),
      ],
      ['copy', /unknown option 'dontWake'/, () => u.copy(r, 0, page, bad({ wake: false, dontWake: true }))],
      [
        'move',
        /move: options: unknown option 'allowSrcHoles' \(the options are wake, allowSourceHoles\)/,
        () => u.move(r, 0, staging, 0, 4096, bad({ allowSrcHoles: true })),
      ],
      ['zeropage', /zeropage: options: unknown option 'wakeup'/, () => u.zeropage(r, 0, 4096, bad({ wakeup: true }))],
      ['continue', /continue: options: unknown option 'wp'/, () => u.continue(r, 0, 4096, bad({ wp: true }))],
      ['poison', /poison: options: unknown option 'wakeup'/, () => u.poison(r, 0, 4096, bad({ wakeup: true }))],
      ['writeProtect', /writeProtect: options: unknown option 'wakeup'/, () => u.writeProtect(r, 0, 4096, false, bad({ wakeup: true }))],
      ['dirtyPages', /dirtyPages: options: unknown option 'reArm'/, () => u.dirtyPages(r, bad({ reArm: false }))],
      ['unregister', /unregister: options: unknown option 'len'/, () => u.unregister(r, bad({ len: 4096 }))],
    ];
    for (const [what, message, fn] of cases) {
      const e = thrown(fn);
      expect(e.code, what).toBe('ERR_INVALID_ARG_VALUE');
      expect(e.message, what).toMatch(message);
    }
    // Refused before the ioctl: nothing was placed, and the known keys still work.
    expect(r.residentPages(0, 4096)).toBe(0);
    expect(u.copy(r, 0, page, { wake: true, writeProtect: false, length: 4096 })).toBe(4096);
    expect(new Uint8Array(r.buffer, 0, 4096).every((b) => b === 7)).toBe(true);
  } finally {
    u.close();
  }
});
