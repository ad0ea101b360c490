/** Where a host keeps sessions' sandboxes by default: a directory of /dev/shm named after its DATA_DIR. */
import { createHash } from 'node:crypto';
import * as path from 'node:path';

/** The scratch directory a host with this DATA_DIR uses by default when /dev/shm is a tmpfs. */
export function defaultScratchDir(dataDir: string): string {
  return path.join('/dev/shm', `sap-sandboxes-${createHash('sha256').update(path.resolve(dataDir)).digest('hex').slice(0, 12)}`);
}
