import { isTemplate, TEMPLATE_NAMES } from '../../contract/templates';
import { ApiError } from '../../contract/errors';
import type { ImageManifest } from '../../store/checkpoints';
import type { SandboxDoc } from '../../store/sandboxes';
import type { BuildLog } from '../checkpoints/snapshot-builder';
import { refuseUnsupported, type SandboxCreateRequest, type SandboxService } from './sandboxes';
import { assertBuilderMemory, type SnapshotService } from '../checkpoints/snapshots';
import type { SandboxDeps } from '../deps';

/** A create of POST /api/sandboxes: from the base image, a snapshot, or an image manifest. */
export type SandboxCreate = SandboxCreateRequest & { snapshot?: string; image?: ImageManifest };

/** Creating a sandbox from what the body names: the base image, a snapshot, or an image (built once and cached). */
export function createSandboxCreator(deps: Pick<SandboxDeps, 'cfg'>, sandboxes: SandboxService, snapshots: SnapshotService) {
  return {
    /** What is refused before anything starts (400, 501): checked before an answer begins to stream. */
    check(body: SandboxCreate): void {
      if (!isTemplate(body.templateID)) {
        throw new ApiError(
          'invalid_request',
          `body.templateID: unknown template ${JSON.stringify(body.templateID)}; the templates are ${TEMPLATE_NAMES.join(', ')} (all the base image, which has every runtime)`,
        );
      }
      if (body.image && body.snapshot) throw new ApiError('invalid_request', 'body: give at most one of image and snapshot');
      refuseUnsupported(body);
      if (body.image) assertBuilderMemory(deps, body.image);
    },

    /** Creates the sandbox; an image's build progress goes to `log`. Call check first. */
    async create(orgId: string, body: SandboxCreate, log: BuildLog = () => undefined): Promise<SandboxDoc> {
      if (body.image) {
        const snap = await snapshots.imageSnapshot(orgId, body.image, log);
        return sandboxes.provisionFromSnapshot(orgId, body, snap._id);
      }
      return body.snapshot ? sandboxes.provisionFromSnapshot(orgId, body, body.snapshot) : sandboxes.provision(orgId, body);
    },
  };
}
