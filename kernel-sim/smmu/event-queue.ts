// The SMMU event queue: a bounded ring of encoded records. When it is full a new record is
// lost and counted (the driver logs "EVTQ overflow -- events lost"), never silently.
import { decodeEvent, encodeEvent, type SmmuEventRecord } from './records.js';

/** The SMMU's event queue: a bounded ring of event records the driver drains on its IRQ. */
export class EventQueue {
  /** Records the queue holds; more overflow (and are counted). */
  readonly capacity: number;
  #ring: BigUint64Array[] = [];
  #overflows = 0;
  #recorded = 0;

  constructor(capacity: number) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError(`event queue capacity must be a positive integer, got ${capacity}`);
    this.capacity = capacity;
  }

  /** Write a record; false (and counted) when the queue is full. */
  push(record: SmmuEventRecord): boolean {
    if (this.#ring.length >= this.capacity) {
      this.#overflows++;
      return false;
    }
    this.#ring.push(encodeEvent(record));
    this.#recorded++;
    return true;
  }

  /** Drain every record (the IRQ handler's loop), decoded. */
  drain(): SmmuEventRecord[] {
    const out = this.#ring.map(decodeEvent);
    this.#ring = [];
    return out;
  }

  /** Records waiting. */
  get length(): number {
    return this.#ring.length;
  }
  /** Records lost to a full queue. */
  get overflows(): number {
    return this.#overflows;
  }
  /** Records ever queued. */
  get recorded(): number {
    return this.#recorded;
  }
}
