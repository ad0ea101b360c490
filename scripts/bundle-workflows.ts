import fs from 'node:fs';
import path from 'node:path';
import { bundleWorkflowCode } from '@temporalio/worker';

/** Bundles the workflow code once at build time, so workers start in ~0.4 s instead of ~2 s. */
async function main(): Promise<void> {
  const { code } = await bundleWorkflowCode({
    workflowsPath: require.resolve('../workflows'),
    logger: { log() {}, info() {}, warn: console.warn, error: console.error, debug() {}, trace() {} } as never,
  });
  const out = path.resolve(__dirname, '..', 'workflow-bundle.js');
  fs.writeFileSync(out, code);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
