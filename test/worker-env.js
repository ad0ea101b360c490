/**
 * Runs in each jest worker before each integration file (setupFiles): the worker's own test stack.
 * test/global-setup.ts starts one stack per worker and names stack k's details SAP_TEST_*_k; worker k
 * (JEST_WORKER_ID; 1 in band) gets them as SAP_TEST_*, which is all the tests and helpers read. Stacks
 * a test starts itself (two hosts, the production profile) take their networks and ids from
 * SAP_STACK_SLOT (scripts/launcher.ts hostEnvironment), so two workers' such stacks never meet.
 */
const worker = process.env.JEST_WORKER_ID || '1';
const suffix = new RegExp(`^(SAP_TEST_[A-Z_]+)_${worker}$`);
for (const [name, value] of Object.entries(process.env)) {
  const m = suffix.exec(name);
  if (m && value !== undefined) process.env[m[1]] = value;
}
process.env.SAP_STACK_SLOT = worker;
