import { randomBytes } from "node:crypto";
import { hostname } from "node:os";

/** The longest worker id the server accepts, in bytes. */
export const WORKER_ID_MAX_BYTES = 200;

/**
 * A worker id unique to this process: host-pid-random, as the Go library
 * makes them, so leases held by Go and TypeScript processes read alike.
 */
export function defaultWorkerId(): string {
  let host = hostname();
  if (host === "" || Buffer.byteLength(host) > 100 || /[\x00-\x1f]/.test(host)) host = "unknown";
  return `${host}-${process.pid}-${randomBytes(4).toString("hex")}`;
}
