import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { PROJECT_ROOT } from '../config';

/**
 * The files the bundle is made of, as far as they change with this checkout: the compiled workflow
 * code (dist/workflows/index.js and every relative require it reaches), this script, and the
 * lockfile (the @temporalio packages it bundles and bundles with).
 */
export function bundleInputs(entry: string): string[] {
  const seen = new Set<string>();
  const todo = [entry];
  while (todo.length > 0) {
    const file = todo.pop()!;
    if (seen.has(file)) continue;
    seen.add(file);
    const code = fs.readFileSync(file, 'utf8');
    for (const m of code.matchAll(/\brequire\("(\.{1,2}\/[^"]+)"\)/g)) {
      const target = path.resolve(path.dirname(file), m[1]!);
      const found = [`${target}.js`, path.join(target, 'index.js'), target].find((f) => fs.existsSync(f) && fs.statSync(f).isFile());
      if (found) todo.push(found);
    }
  }
  return [...seen, __filename, path.join(PROJECT_ROOT, 'package-lock.json')].sort();
}

/** A hash of the inputs' paths and contents. */
export function hashInputs(files: string[]): string {
  const h = createHash('sha256');
  for (const f of files) h.update(`${f}\0`).update(fs.readFileSync(f)).update('\0');
  return h.digest('hex');
}

/**
 * Packages that must never be in the workflow bundle. The worker evaluates the bundle for its
 * workflows and the SDK maps every workflow promise's stack through its source map, so its size
 * costs CPU on every workflow of every kind: zod alone (reached once through a schema module of
 * contract/) doubled the bundle and added 10–20 ms of worker CPU per session (docs/performance.md).
 * The rest have side effects no workflow may have.
 */
export const NOT_IN_WORKFLOW_BUNDLE = ['zod', '@asteasolutions/zod-to-openapi', 'mongodb', 'express', 'pino', 'ws'];

/** The packages of NOT_IN_WORKFLOW_BUNDLE that a bundle's code includes. */
export function forbiddenInBundle(code: string): string[] {
  return NOT_IN_WORKFLOW_BUNDLE.filter((pkg) => code.includes(`./node_modules/${pkg}/`));
}

/**
 * Bundles the workflow code once at build time, so workers start in ~0.4 s instead of ~2 s; skipped
 * (about 3 s saved) when the bundle's inputs are those of the bundle there (their hash beside it).
 */
async function main(): Promise<void> {
  const entry = require.resolve('../workflows');
  const out = path.resolve(__dirname, '..', 'workflow-bundle.js');
  const stamp = `${out}.inputs`;
  const hash = hashInputs(bundleInputs(entry));
  if (fs.existsSync(out) && fs.existsSync(stamp) && fs.readFileSync(stamp, 'utf8') === hash) return;
  // Loaded only when a bundle is made: the module alone takes about half a second to load.
  const { bundleWorkflowCode } = await import('@temporalio/worker');
  const { code } = await bundleWorkflowCode({
    workflowsPath: entry,
    logger: { log() {}, info() {}, warn: console.warn, error: console.error, debug() {}, trace() {} } as never,
  });
  const forbidden = forbiddenInBundle(code);
  if (forbidden.length > 0) {
    throw new Error(
      `the workflow bundle includes ${forbidden.join(', ')}: a workflow imports a module that reaches ${forbidden.length > 1 ? 'them' : 'it'} ` +
        '(import such modules as types only, or move the values a workflow needs to a module without them, as contract/conversation-rules.ts)',
    );
  }
  fs.rmSync(stamp, { force: true });
  fs.writeFileSync(out, code);
  fs.writeFileSync(stamp, hash);
}

if (require.main === module) {
  main().catch((err) => {
    console.error(err);
    process.exit(1);
  });
}
