/**
 * The template names POST /api/sandboxes accepts (`templateID`, the OpenComputer client's
 * `Sandbox.create({ template })`). There is one image, the base image, and it has every runtime
 * (Node.js, Python, a shell and the usual tools), so every name here starts a sandbox from it; the
 * others are the names OpenComputer's clients and examples ask for. A sandbox's `templateID` is the
 * name it was created with. Anything else is refused (400) with this list.
 */
export const TEMPLATES = {
  base: 'the base image',
  default: "the base image (OpenComputer's default template)",
  node: 'the base image (it has Node.js and npm)',
  python: 'the base image (it has Python 3 and pip)',
} as const;

export type TemplateName = keyof typeof TEMPLATES;

/** The accepted template names, in the order they are listed in errors and docs. */
export const TEMPLATE_NAMES = Object.keys(TEMPLATES) as TemplateName[];

/** True when `name` is a template a sandbox can be created from. */
export function isTemplate(name: string): name is TemplateName {
  return Object.prototype.hasOwnProperty.call(TEMPLATES, name);
}
