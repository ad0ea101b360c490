/**
 * What the workflow bundle may hold. The worker evaluates the bundle and maps each workflow promise's
 * stack through its source map, so what a workflow imports costs CPU on every workflow (zod, reached
 * once through contract/conversations.ts, doubled the bundle and the worker's CPU per session rose by
 * about half). The build refuses a bundle with such a package (scripts/bundle-workflows.ts); this
 * test finds the import that would bring one in before the build, from the TypeScript sources.
 */
import fs from 'node:fs';
import path from 'node:path';
import { forbiddenInBundle, NOT_IN_WORKFLOW_BUNDLE } from '../../scripts/bundle-workflows';

const ROOT = path.resolve(__dirname, '..', '..');

/** Value imports and re-exports of a TypeScript file (`import type` and `export type` are erased). */
function valueImports(file: string): string[] {
  const code = fs.readFileSync(file, 'utf8');
  const out: string[] = [];
  for (const m of code.matchAll(/^(?:import|export)\s+(?!type\b)([^;]*?)\s+from\s+'([^']+)'/gms)) out.push(m[2]!);
  for (const m of code.matchAll(/^import\s+'([^']+)'/gm)) out.push(m[1]!);
  return out;
}

/** Every package a file reaches through value imports, with the chain that reaches it. */
function packagesReached(entry: string): Map<string, string[]> {
  const reached = new Map<string, string[]>();
  const seen = new Set<string>();
  const walk = (file: string, chain: string[]): void => {
    if (seen.has(file)) return;
    seen.add(file);
    for (const spec of valueImports(file)) {
      if (spec.startsWith('.')) {
        const base = path.resolve(path.dirname(file), spec);
        const found = [`${base}.ts`, path.join(base, 'index.ts')].find((f) => fs.existsSync(f));
        if (found) walk(found, [...chain, path.relative(ROOT, found)]);
      } else {
        const pkg = spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : spec.split('/')[0]!;
        if (!reached.has(pkg)) reached.set(pkg, chain);
      }
    }
  };
  walk(entry, [path.relative(ROOT, entry)]);
  return reached;
}

describe('the workflow bundle', () => {
  it('reaches none of the packages it must not hold, through any value import of workflows/', () => {
    const reached = packagesReached(path.join(ROOT, 'workflows', 'index.ts'));
    const bad = NOT_IN_WORKFLOW_BUNDLE.filter((p) => reached.has(p)).map((p) => `${p} via ${reached.get(p)!.join(' → ')}`);
    expect(bad).toEqual([]);
    // The walk does follow imports: it finds the SDK the workflows use.
    expect(reached.has('@temporalio/workflow')).toBe(true);
  });

  it('is refused by the build when its code holds one of them', () => {
    expect(forbiddenInBundle('__webpack_modules__ = { "./node_modules/zod/index.cjs": function() {} }')).toEqual(['zod']);
    expect(forbiddenInBundle('"./node_modules/@temporalio/workflow/lib/index.js"')).toEqual([]);
  });
});
