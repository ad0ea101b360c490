import { listRecentHosts } from '../../store/hosts';
import { hostAlive } from '../hosts/placement';
import type { ServiceDeps } from '../deps';
import type { HostView } from '../../contract/views';
import type { KeyRole } from '../../store';

/** One sandbox host as the console shows it (contract/console.ts). */
export type HostSummary = HostView;

/**
 * What the web console reads besides the resources: the Temporal UI's address, and the hosts' load.
 * Both are the operator's (the UI shows every organisation's workflows; the hosts every organisation's
 * load): a tenant gets no UI address, and the route of the hosts refuses it (api/routes/console.ts).
 */
export interface ConsoleService {
  config(role: KeyRole): { temporalUiUrl: string | null; temporalNamespace: string; role: KeyRole };
  hosts(): Promise<HostSummary[]>;
}

const MAX_HOSTS = 1_000;

export function createConsoleService(deps: ServiceDeps): ConsoleService {
  const deadAfterMs = deps.cfg.HOST_DEAD_AFTER * 1000;
  return {
    config: (role) => ({
      temporalUiUrl: role === 'operator' ? (deps.cfg.TEMPORAL_UI_URL?.replace(/\/+$/, '') ?? null) : null,
      temporalNamespace: deps.cfg.TEMPORAL_NAMESPACE,
      role,
    }),
    async hosts() {
      const docs = await listRecentHosts(deps.store, MAX_HOSTS);
      return docs.map((d) => ({
        hostId: d._id,
        status: d.lostAt || !hostAlive(d, deadAfterMs) ? 'lost' : 'live',
        heartbeatAt: new Date(d.updatedAt).toISOString(),
        lostAt: d.lostAt ? new Date(d.lostAt).toISOString() : null,
        sandboxes: d.capacity?.sandboxes ?? null,
        maxSandboxes: d.capacity?.maxSandboxes ?? null,
        reservedMB: d.capacity?.reservedMB ?? null,
        memoryMB: d.capacity?.memoryMB ?? null,
      }));
    },
  };
}
