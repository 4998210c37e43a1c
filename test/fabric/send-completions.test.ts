// Sends ask the provider for a completion only every so often (native/fabric.cc,
// kSendCompleteEvery): the completion of one frees the send buffers of those before it. Two
// raw connections in one process over libfabric tcp on loopback: a burst of messages, more
// than that period and more bytes than the provider can have on the socket at once, sent in
// one turn from one JavaScript buffer rewritten after every send, arrives whole and in order,
// byte for byte, with nothing but the sender's own progress (the receiver never answers).
import { afterEach, describe, expect, it } from 'vitest';
import { fabricBinding } from '../../native/index.js';
import { built, ci } from './spawn.js';

const handles: number[] = [];
afterEach(() => {
  for (const h of handles.splice(0)) fabricBinding().fabricClose(h);
});

// Message i: its size, and each byte a function of i and its offset.
const SIZES = [64, 100, 4096, 3 << 20, 200, 1 << 20];
const size = (i: number) => SIZES[i % SIZES.length]!;
const byte = (i: number, at: number) => (i * 31 + at * 7 + (at >> 12)) & 0xff;

describe.skipIf(!built && !ci)('send completions', () => {
  it('a burst of sends, one buffer reused for each at once, arrives byte for byte and in order', async () => {
    const fi = fabricBinding();
    const count = 60;
    const got: Uint8Array[] = [];
    let accepted = 0;
    let done: () => void;
    const all = new Promise<void>((resolve) => (done = resolve));
    const listening = fi.fabricListen('tcp', '127.0.0.1', 0, (h, kind, a) => {
      if (kind === 'request') return true;
      if (kind === 'connection') {
        handles.push((accepted = a as number));
        // As the transport does once a hello is taken: more than the one receive posted for it.
        fi.fabricLimits(accepted, { posted: 8 });
      }
      if (kind === 'message' && h === accepted) {
        // A view of the receive slot, reposted when this returns: copied.
        got.push((a as Uint8Array).slice());
        if (got.length === count) done();
      }
    });
    handles.push(listening.handle);
    let client = 0;
    const connected = new Promise<void>((resolve, reject) => {
      client = fi.fabricConnect('tcp', '127.0.0.1', listening.port, (_h, kind, a) => {
        if (kind === 'connected') resolve();
        if (kind === 'error' || kind === 'shutdown') reject(a as Error);
      });
      handles.push(client);
    });
    await connected;
    const buf = new Uint8Array(3 << 20);
    for (let i = 0; i < count; i++) {
      const n = size(i);
      for (let at = 0; at < n; at++) buf[at] = byte(i, at);
      fi.fabricSend(client, buf.subarray(0, n));
    }
    buf.fill(0);
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([
      all,
      new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`${got.length} of ${count} messages arrived`)), 20_000))),
    ]);
    clearTimeout(timer);
    expect(got.map((m) => m.length)).toEqual(Array.from({ length: count }, (_, i) => size(i)));
    for (let i = 0; i < count; i++) {
      const m = got[i]!;
      let bad = -1;
      for (let at = 0; at < m.length && bad < 0; at++) if (m[at] !== byte(i, at)) bad = at;
      expect([i, bad]).toEqual([i, -1]);
    }
  }, 30_000);
});
