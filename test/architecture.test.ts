import { readdirSync, readFileSync } from 'node:fs';
import { join, relative, sep } from 'node:path';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

/**
 * One data-access shape (docs/architecture.md): every SQL statement of a feature lives in
 * its `src/shared/<feature>/queries.ts`; the raw-SQL helper, the ORM set-up and the
 * migrations live in `src/shared/db/`. No other file under src/ holds SQL text.
 */

const root = join(import.meta.dirname, '..');
const src = join(root, 'src');

/** Where SQL text belongs. */
function isDataAccess(file: string): boolean {
  return /^src\/shared\/[^/]+\/queries\.ts$/.test(file) || file.startsWith('src/shared/db/');
}


// `select` as SQL, not the HTML element, the CSS selector or the DOM method of the dashboard.
const sqlText = [/(?<![<./])\bselect\b(?![[(,>]|\s*\{)/i, /\b(insert into|delete from)\b/i, /\bupdate\s+\w+\s+(\w+\s+)?set\b/i];

/** MikroORM's QueryBuilder takes a result mode, not SQL: `qb.execute('all')`. */
const resultModes = new Set(['all', 'get', 'run']);

function literalText(node: ts.Node): string | undefined {
  if (ts.isStringLiteral(node) || ts.isNoSubstitutionTemplateLiteral(node)) return node.text;
  if (ts.isTemplateExpression(node)) return [node.head.text, ...node.templateSpans.map((span) => span.literal.text)].join(' ');
  return undefined;
}

/** What in `text` (a TypeScript file) reads as SQL: one line per finding. */
function findSql(text: string, fileName = 'file.ts'): string[] {
  const source = ts.createSourceFile(fileName, text, ts.ScriptTarget.ES2022, true, ts.ScriptKind.TS);
  const found: string[] = [];
  const at = (node: ts.Node) => `line ${source.getLineAndCharacterOfPosition(node.getStart(source)).line + 1}`;
  const visit = (node: ts.Node) => {
    // Import specifiers and type positions are not statements.
    if (ts.isImportDeclaration(node) || ts.isExportDeclaration(node) || ts.isLiteralTypeNode(node)) return;
    const literal = literalText(node);
    if (literal !== undefined && sqlText.some((pattern) => pattern.test(literal))) {
      found.push(`${at(node)}: ${JSON.stringify(literal.replace(/\s+/g, ' ').trim().slice(0, 80))}`);
    }
    if (
      ts.isCallExpression(node) &&
      ts.isPropertyAccessExpression(node.expression) &&
      ['execute', 'raw'].includes(node.expression.name.text) &&
      node.arguments[0] !== undefined &&
      literalText(node.arguments[0]) !== undefined &&
      !resultModes.has(literalText(node.arguments[0])!)
    ) {
      found.push(`${at(node)}: .${node.expression.name.text}() with a literal`);
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return found;
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sourceFiles(path);
    return entry.name.endsWith('.ts') ? [path] : [];
  });
}

describe('architecture: one data-access shape', () => {
  it('finds SQL in string and template literals and in execute/raw calls', () => {
    expect(findSql("const a = 'select id from t where x = ?';")).toHaveLength(1);
    expect(findSql('const a = `insert into t (a) values (${1})`;')).toHaveLength(1);
    expect(findSql("const a = 'UPDATE emails e SET status = 1';")).toHaveLength(1);
    expect(findSql("const a = 'delete from t';")).toHaveLength(1);
    expect(findSql("await knex.raw('vacuum');")).toHaveLength(1);
    expect(findSql("await em.execute('vacuum');")).toHaveLength(1);
    expect(findSql("const a = 'update the list, then set it';")).toHaveLength(0);
    expect(findSql("const a = 'Select a list';")).toHaveLength(1);
    expect(findSql("import { select } from './select.js'; const b = run(text);")).toHaveLength(0);
    expect(findSql('const a = `<select id="tag"><option>${t}</option></select>`; area.select();')).toHaveLength(0);
    expect(findSql("const a = 'input, select, textarea { color: red } select { x: 1 }'; q('select[data-zone]');")).toHaveLength(0);
    expect(findSql("await qb.execute('all', true);")).toHaveLength(0);
  });

  it('keeps SQL text in src/shared/<feature>/queries.ts and src/shared/db/ only', () => {
    const offenders: string[] = [];
    for (const path of sourceFiles(src)) {
      const file = relative(root, path).split(sep).join('/');
      if (isDataAccess(file)) continue;
      const found = findSql(readFileSync(path, 'utf8'), file);
      if (found.length > 0) offenders.push(`${file}\n  ${found.join('\n  ')}`);
    }
    expect(offenders, `SQL outside the data-access modules:\n${offenders.join('\n')}`).toEqual([]);
  });
});

describe('comments cite the project, not documents a reader of the repository does not have', () => {
  // A section number of the spec, the contract or the style guide: the project's docs/*.md
  // say the same in their own words.
  const citation = /\b(?:spec|contract|style)(?: section)? ?\d+(?:\.\d+)?\b/i;

  it('no file of src/, test/, bench/ or scripts/ names a section of the spec, the contract or the style guide', () => {
    const offenders: string[] = [];
    for (const dir of ['src', 'test', 'bench', 'scripts']) {
      for (const path of sourceFiles(join(root, dir))) {
        readFileSync(path, 'utf8')
          .split('\n')
          .forEach((line, i) => {
            // RFC sections and JSON-RPC's version are another matter.
            if (citation.test(line) && !/rfc|json-?rpc/i.test(line)) offenders.push(`${relative(root, path)}:${i + 1}: ${line.trim()}`);
          });
      }
    }
    expect(offenders).toEqual([]);
  });
});
