/**
 * dependency-cruiser: the layering of the code, as rules. `npm run lint` runs
 *   depcruise --config .dependency-cruiser.cjs api workflows activities worker sandbox store scripts lib config client cli contract services test
 * and fails naming each broken rule. The layout (top to bottom):
 *   api/ (HTTP only) → services/ (domain operations) → store/ (every MongoDB call) and the sandbox
 *   host's client (through sandbox/index.ts, its one entry point); activities/ and worker/ call services/
 *   (api/, activities/ and worker/ never store/: adapters-not-store); workflows/ import activities' types only; contract/ (schemas, views, the error
 *   registry) is pure data that everyone may import; client/ (the published client) imports contract/ only.
 * Workflow definition modules (signals, queries, argument types, search attributes: what services/
 * may import) are named workflows/defs*.ts or workflows/*.defs.ts.
 */
const PROJECT = '^(api|services|store|activities|workflows|sandbox|lib|config|client|cli|worker|scripts|test|contract)/';
const WORKFLOW_DEFS = '^workflows/(defs[^/]*|[^/]+[.]defs)[.]ts$';

module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      severity: 'error',
      comment: 'An import cycle: the modules in it cannot be read, tested or loaded one without the others.',
      from: {},
      to: { circular: true },
    },
    {
      name: 'routes-are-http-only',
      severity: 'error',
      comment: 'A route file parses, calls one service and shapes the answer: it imports no other route file and not the store.',
      from: { path: '^api/routes/' },
      to: { path: '^(api/routes|store)/' },
    },
    {
      name: 'api-not-from-below',
      severity: 'error',
      comment: 'Nothing below the HTTP layer imports api/ (views and errors live in contract/, domain logic in services/).',
      from: { pathNot: '^(api|scripts|test)/' },
      to: { path: '^api/' },
    },
    {
      name: 'contract-is-pure',
      severity: 'error',
      comment: 'contract/ is pure data (zod schemas, views, the error registry): it imports no other project folder.',
      from: { path: '^contract/' },
      to: { path: PROJECT, pathNot: '^contract/' },
    },
    {
      name: 'contract-is-pure',
      severity: 'error',
      comment: 'contract/ imports at run time only zod, zod-to-openapi and itself (node modules as types only).',
      from: { path: '^contract/' },
      to: {
        pathNot: ['^contract/', 'node_modules/(zod|@asteasolutions/zod-to-openapi)/'],
        dependencyTypesNot: ['type-only'],
      },
    },
    {
      name: 'services-below-api',
      severity: 'error',
      comment: 'services/ sit below the HTTP layer and the processes: they import neither api/ nor cli/ or worker/.',
      from: { path: '^services/' },
      to: { path: '^(api|cli|worker|scripts)/' },
    },
    {
      name: 'services-below-api',
      severity: 'error',
      comment: 'services/ may import activities/ as types only.',
      from: { path: '^services/' },
      to: { path: '^activities/', dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'services-below-api',
      severity: 'error',
      comment:
        'services/ import workflows/ definition modules only (workflows/defs*.ts, workflows/*.defs.ts), never a workflow; the workflows themselves as types only (services/workflow-control.ts checks a start against them).',
      from: { path: '^services/' },
      to: { path: '^workflows/', pathNot: WORKFLOW_DEFS, dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'workflows-import-activity-types-only',
      severity: 'error',
      comment: 'Workflow code is deterministic and bundled apart: it imports activities/ (and any other layer with side effects) as types only.',
      from: { path: '^workflows/' },
      to: { path: '^(activities|api|services|store|sandbox|worker|cli|client|scripts)/', dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'store-below-services',
      severity: 'error',
      comment: 'store/ is the bottom layer: it imports no services/, api/, activities/ or processes.',
      from: { path: '^store/' },
      to: { path: '^(services|api|activities|cli|worker|scripts)/' },
    },
    {
      name: 'store-below-services',
      severity: 'error',
      comment:
        "store/ keeps queries and documents only: it imports nothing from sandbox/ or workflows/, not even types (the shapes it shares with them, a host's load or a workflow's arguments, are contract/'s).",
      from: { path: '^store/' },
      to: { path: '^(sandbox|workflows)/' },
    },
    {
      name: 'adapters-not-store',
      severity: 'error',
      comment:
        "api/, activities/ and worker/ are adapters over services/ (HTTP, Temporal, the worker's loops): they reach the store through a service, never store/ itself, not even for a type.",
      from: { path: '^(api|activities|worker)/' },
      to: { path: '^store/' },
    },
    {
      name: 'only-store-uses-mongodb',
      severity: 'error',
      comment: 'Every MongoDB call is in store/ (scripts/ and test/ may reach the database directly).',
      from: { pathNot: '^(store|scripts|test)/' },
      to: { path: 'node_modules/(mongodb|bson)/' },
    },
    {
      name: 'sandbox-entry-point',
      severity: 'error',
      comment: 'The control plane imports the sandbox module through its one entry point, sandbox/index.ts.',
      from: { pathNot: '^(sandbox|scripts|test)/' },
      to: { path: '^sandbox/', pathNot: '^sandbox/index[.]ts$' },
    },
    {
      name: 'sandbox-entry-point',
      severity: 'error',
      comment: "scripts/ import the sandbox module's entry point, or the host's main module to start a host.",
      from: { path: '^scripts/' },
      to: { path: '^sandbox/', pathNot: '^sandbox/(index|host/main)[.]ts$' },
    },
    {
      name: 'host-contract-is-pure',
      severity: 'error',
      comment:
        "sandbox/host-contract/ (the host's wire contract, declared once in wire.ts, and its client) imports nothing of the host or the sandbox runtime: only itself and contract/.",
      from: { path: '^sandbox/host-contract/' },
      to: { path: PROJECT, pathNot: '^(sandbox/host-contract|contract)/' },
    },
    {
      name: 'host-contract-is-pure',
      severity: 'error',
      comment: 'sandbox/host-contract/ imports of packages: zod and ws only (and node builtins).',
      from: { path: '^sandbox/host-contract/' },
      to: { path: 'node_modules/', pathNot: 'node_modules/(zod|ws|@types/(ws|node))/' },
    },
    {
      name: 'client-imports-contract-only',
      severity: 'error',
      comment: 'The published client depends on the public contract only.',
      from: { path: '^client/' },
      to: { path: PROJECT, pathNot: '^(client|contract)/' },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '^(dist|[.]tools|[.]data|tools|coverage)/' },
    // Type-only imports are seen (and told apart: dependencyTypes 'type-only') only before compilation.
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.test.json' },
    enhancedResolveOptions: { exportsFields: ['exports'], conditionNames: ['import', 'require', 'node', 'default'] },
    reporterOptions: {
      text: { highlightFocused: true },
      archi: { collapsePattern: '^(node_modules/[^/]+|[^/]+)/' },
    },
  },
};
