/**
 * What the build skips when nothing changed: the workflow bundle's inputs (scripts/bundle-workflows.ts)
 * are the compiled workflow files it reaches by relative require, this script and the lockfile; a
 * change to any of them changes their hash, a file outside them does not.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { bundleInputs, hashInputs } from '../../scripts/bundle-workflows';

describe('the workflow bundle’s inputs', () => {
  let dir: string;
  beforeEach(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sap-bundle-inputs-'));
    const write = (f: string, text: string) => {
      fs.mkdirSync(path.dirname(path.join(dir, f)), { recursive: true });
      fs.writeFileSync(path.join(dir, f), text);
    };
    write('workflows/index.js', 'var a = require("./a");\nvar lib = require("../lib");\nvar w = require("@temporalio/workflow");\n');
    write('workflows/a.js', 'var e = require("../contract/errors");\n');
    write('contract/errors.js', 'exports.x = 1;\n');
    write('lib/index.js', 'var a = require("../workflows/a");\n');
    write('lib/unrelated.js', 'exports.y = 2;\n');
  });
  afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

  it('are the files reached by relative require (file.js or dir/index.js), once each, and not the others', () => {
    const files = bundleInputs(path.join(dir, 'workflows', 'index.js')).filter((f) => f.startsWith(dir));
    expect(files.map((f) => path.relative(dir, f)).sort()).toEqual(['contract/errors.js', 'lib/index.js', 'workflows/a.js', 'workflows/index.js']);
  });

  it('hash differently when one of them changes, the same when a file outside them does', () => {
    const entry = path.join(dir, 'workflows', 'index.js');
    const before = hashInputs(bundleInputs(entry));
    fs.writeFileSync(path.join(dir, 'lib', 'unrelated.js'), 'exports.y = 3;\n');
    expect(hashInputs(bundleInputs(entry))).toBe(before);
    fs.writeFileSync(path.join(dir, 'contract', 'errors.js'), 'exports.x = 2;\n');
    expect(hashInputs(bundleInputs(entry))).not.toBe(before);
  });
});

describe('the server build’s inputs', () => {
  // `tsc -b` decides whether to build again from the files its `include` names: a folder compiled only
  // because another imports it is built on a clean build, and not again when it alone changes (npm
  // start would then run the old code). Every top-level folder of TypeScript sources is named.
  const root = path.join(__dirname, '..', '..');
  const hasTs = (dir: string): boolean =>
    fs.readdirSync(dir, { withFileTypes: true }).some((e) => (e.isDirectory() ? hasTs(path.join(dir, e.name)) : e.name.endsWith('.ts')));
  // Not the server's: the tests (tsconfig.test.json), the console (its own tsconfig and build).
  const elsewhere = new Set(['node_modules', 'dist', 'test', 'console']);
  const folders = fs
    .readdirSync(root, { withFileTypes: true })
    .filter((e) => e.isDirectory() && !e.name.startsWith('.') && !elsewhere.has(e.name) && hasTs(path.join(root, e.name)))
    .map((e) => e.name)
    .sort();
  const include = (file: string) => (JSON.parse(fs.readFileSync(path.join(root, file), 'utf8')) as { include: string[] }).include;

  it('name every top-level folder of sources in tsconfig.json, and with the tests in tsconfig.test.json', () => {
    expect(folders).toEqual(expect.arrayContaining(['api', 'services', 'store']));
    expect(folders.filter((f) => !include('tsconfig.json').includes(f))).toEqual([]);
    expect([...folders, 'test'].filter((f) => !include('tsconfig.test.json').includes(f))).toEqual([]);
  });
});
