// The same fault in the form today's Linux IOPF framework uses (drivers/iommu/io-pgfault.c,
// include/linux/iommu.h), so a user can see what a current kernel would do with it.
import { type SmmuEventRecord, EvtId, ResumeResp } from '../smmu/records.js';

/** iommu_fault type: a recoverable page request. */
export const IOMMU_FAULT_PAGE_REQ = 1;
/** Page request flag: the PASID field is valid. */
export const IOMMU_FAULT_PAGE_REQUEST_PASID_VALID = 1 << 0;
/** Page request flag: the last page of a group; a response is expected. */
export const IOMMU_FAULT_PAGE_REQUEST_LAST_PAGE = 1 << 1;
/** Page request flag: the response must carry the PASID. */
export const IOMMU_FAULT_PAGE_RESPONSE_NEEDS_PASID = 1 << 2;
/** Permission asked: read. */
export const IOMMU_FAULT_PERM_READ = 1 << 0;
/** Permission asked: write. */
export const IOMMU_FAULT_PERM_WRITE = 1 << 1;
/** Permission asked: execute. */
export const IOMMU_FAULT_PERM_EXEC = 1 << 2;
/** Permission asked: privileged. */
export const IOMMU_FAULT_PERM_PRIV = 1 << 3;

/** Linux's iommu_page_response_code: the answer to a page request. */
export enum IommuPageResponseCode {
  /** Page tables populated: retry the access. */
  SUCCESS = 0,
  /** Cannot handle: do not retry. */
  INVALID = 1,
  /** General error: stop accepting faults from the device. */
  FAILURE = 2,
}

/** Linux's struct iommu_fault_page_request, as the IOPF framework reports a fault. */
export interface IommuFaultPageRequest {
  /** Always IOMMU_FAULT_PAGE_REQ. */
  type: typeof IOMMU_FAULT_PAGE_REQ;
  /** IOMMU_FAULT_PAGE_REQUEST_* flags. */
  flags: number;
  /** Process address space id (the SSID). */
  pasid: number;
  /** Page request group id (the record's STAG). */
  grpid: number;
  /** IOMMU_FAULT_PERM_* bits. */
  perm: number;
  /** Faulting address. */
  addr: bigint;
  /** iommufd's hint of how much the device will access: Touch-Ahead in standard form. */
  length: number;
}

/** arm_smmu_handle_event: only stall records become page requests in Linux; the rest are dumped. */
export function toPageRequest(e: SmmuEventRecord, lengthHint: number): IommuFaultPageRequest {
  let perm = e.rnw ? IOMMU_FAULT_PERM_READ : IOMMU_FAULT_PERM_WRITE;
  if (e.ind) perm |= IOMMU_FAULT_PERM_EXEC;
  if (e.pnu) perm |= IOMMU_FAULT_PERM_PRIV;
  let flags = IOMMU_FAULT_PAGE_REQUEST_LAST_PAGE;
  if (e.ssv) flags |= IOMMU_FAULT_PAGE_REQUEST_PASID_VALID;
  return { type: IOMMU_FAULT_PAGE_REQ, flags, pasid: e.ssid, grpid: e.stag, perm, addr: e.addr, length: lengthHint };
}

/** Whether Linux would handle the record as a recoverable fault. */
export function isRecoverable(e: SmmuEventRecord): boolean {
  return e.id === EvtId.F_TRANSLATION || e.id === EvtId.F_ACCESS || (e.id === EvtId.F_PERMISSION && e.stall);
}

/** arm_smmu_page_response: SUCCESS → RETRY, INVALID / FAILURE → ABORT. */
export function resumeFor(code: IommuPageResponseCode): ResumeResp {
  if (code === IommuPageResponseCode.SUCCESS) return ResumeResp.RETRY;
  if (code === IommuPageResponseCode.INVALID || code === IommuPageResponseCode.FAILURE) return ResumeResp.ABORT;
  return ResumeResp.TERM;
}
