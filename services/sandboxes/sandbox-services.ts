/**
 * The sandbox-side services, wired to each other: sandboxes, checkpoints, snapshots, exec and agent
 * sessions, files, terminals, previews. Built once per process by createServices (services/index.ts).
 */
import { createAgentSessionService } from '../agents/agent-sessions';
import { createCheckpointService } from '../checkpoints/checkpoints';
import { createExecService } from '../exec/exec';
import { createExecLive } from '../exec/exec-live';
import { createFileService } from './files';
import { PreviewService } from './previews';
import { createPtyService } from '../exec/pty';
import type { SandboxDeps } from '../deps';
import { createSandboxCreator } from './sandbox-create';
import { createSandboxService } from './sandboxes';
import { createSnapshotService } from '../checkpoints/snapshots';
import { createResourceService } from './sandbox-resources';

/** Builds the sandbox-side services over `deps`. */
export function createSandboxServices(deps: SandboxDeps) {
  const previews = new PreviewService(deps);
  const sandboxes = createSandboxService(deps, previews);
  const snapshots = createSnapshotService(deps);
  const live = createExecLive(deps, sandboxes);
  return {
    sandboxes: { ...sandboxes, ...createSandboxCreator(deps, sandboxes, snapshots) },
    checkpoints: createCheckpointService(deps, sandboxes),
    snapshots,
    previews,
    live,
    exec: createExecService(deps, live),
    agents: createAgentSessionService(deps, live),
    files: createFileService(deps, live, sandboxes),
    pty: createPtyService(deps, live),
    resources: createResourceService(deps),
  };
}

/** The sandbox-side services (see createSandboxServices). */
export type SandboxServices = ReturnType<typeof createSandboxServices>;
