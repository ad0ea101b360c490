import fs from 'node:fs';
import os from 'node:os';

let cached: string | undefined;

/**
 * Names this machine (and container): /etc/machine-id (or the kernel's boot id) with the hostname.
 * Two processes with the same name share a filesystem as far as Unix sockets go; the preview proxy
 * uses it to take a host's Unix socket directly instead of tunnelling through the host's HTTP port.
 */
export function machineName(): string {
  if (cached) return cached;
  const read = (p: string) => {
    try {
      return fs.readFileSync(p, 'utf8').trim();
    } catch {
      return '';
    }
  };
  cached = `${read('/etc/machine-id') || read('/proc/sys/kernel/random/boot_id') || 'unknown'}/${os.hostname()}`;
  return cached;
}
