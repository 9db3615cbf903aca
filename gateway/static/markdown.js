// A small Markdown subset as DOM nodes: fenced code blocks, inline code, headings, lists,
// quotes, bold, italics, http(s) links, paragraphs. Every node is made with createElement and
// every piece of model text goes in through textContent or a Text node: model output can never
// become markup (there is no innerHTML in this page). An unclosed fence (a reply still
// streaming) renders as a code block up to the end.

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)\s*$/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const QUOTE = /^ {0,3}> ?/;
const ITEM = /^ {0,3}([-*+]|\d{1,9}[.)])\s+/;
const RULE = /^ {0,3}([-*_])( *\1){2,}\s*$/;
const INLINE = new RegExp(
  [
    "(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)", // 1, 2: code
    "\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*", // 3: bold
    "(?<![\\w*])\\*(?=[^\\s*])([^*]*?[^\\s*])\\*(?![\\w*])", // 4: italic
    "(?<!\\w)_(?=[^\\s_])([^_]*?[^\\s_])_(?!\\w)", // 5: italic
    "\\[([^\\]\\n]+)\\]\\(([^()\\s]+)\\)", // 6, 7: link
  ].join("|"),
  "g",
);

function el(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

export function renderMarkdown(text) {
  const root = document.createDocumentFragment();
  const lines = text.split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      const body = [];
      for (i++; i < lines.length && !lines[i].trimStart().startsWith(fence[1]); i++) {
        body.push(lines[i]);
      }
      i++; // the closing fence, if any
      root.append(codeBlock(body.join("\n"), fence[2]));
    } else if (!line.trim()) {
      i++;
    } else if (HEADING.test(line)) {
      const [, marks, title] = HEADING.exec(line);
      const heading = el(`h${Math.min(marks.length + 2, 6)}`);
      inline(title, heading);
      root.append(heading);
      i++;
    } else if (RULE.test(line)) {
      root.append(el("hr"));
      i++;
    } else if (QUOTE.test(line)) {
      const body = [];
      for (; i < lines.length && QUOTE.test(lines[i]); i++) body.push(lines[i].replace(QUOTE, ""));
      const quote = el("blockquote");
      quote.append(renderMarkdown(body.join("\n")));
      root.append(quote);
    } else if (ITEM.test(line)) {
      i = list(lines, i, root);
    } else {
      const para = el("p");
      for (let first = true; i < lines.length && isParagraph(lines[i]); i++, first = false) {
        if (!first) para.append(el("br"));
        inline(lines[i], para);
      }
      root.append(para);
    }
  }
  return root;
}

function isParagraph(line) {
  return line.trim() && !FENCE.test(line) && !HEADING.test(line) && !QUOTE.test(line)
    && !ITEM.test(line) && !RULE.test(line);
}

function list(lines, start, root) {
  const ordered = /\d/.test(ITEM.exec(lines[start])[1]);
  const node = el(ordered ? "ol" : "ul");
  let i = start;
  while (i < lines.length && ITEM.test(lines[i]) && /\d/.test(ITEM.exec(lines[i])[1]) === ordered) {
    const item = el("li");
    inline(lines[i].replace(ITEM, ""), item);
    // Indented lines after an item continue it.
    for (i++; i < lines.length && /^\s{2,}\S/.test(lines[i]) && !ITEM.test(lines[i]); i++) {
      item.append(el("br"));
      inline(lines[i].trim(), item);
    }
    node.append(item);
  }
  root.append(node);
  return i;
}

function inline(text, parent) {
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) parent.append(text.slice(last, m.index)); // a Text node
    if (m[1] !== undefined) {
      const code = el("code");
      code.textContent = m[2];
      parent.append(code);
    } else if (m[3] !== undefined) {
      const strong = el("strong");
      inline(m[3], strong);
      parent.append(strong);
    } else if (m[4] !== undefined || m[5] !== undefined) {
      const em = el("em");
      inline(m[4] ?? m[5], em);
      parent.append(em);
    } else {
      parent.append(link(m[6], m[7], m[0]));
    }
    last = m.index + m[0].length;
  }
  if (last < text.length) parent.append(text.slice(last));
}

function link(label, href, source) {
  let url = null;
  try {
    url = new URL(href);
  } catch {
    // not an absolute URL: shown as written
  }
  if (!url || (url.protocol !== "https:" && url.protocol !== "http:")) {
    return document.createTextNode(source); // javascript:, data:, relative: never a link
  }
  const a = el("a");
  a.href = url.href;
  a.title = url.href;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  a.textContent = label;
  return a;
}

function codeBlock(code, lang) {
  const block = el("div", "code-block");
  const bar = el("div", "code-bar");
  const name = el("span");
  name.textContent = lang || "code";
  const copy = el("button", "copy");
  copy.type = "button";
  copy.textContent = "copy";
  copy.addEventListener("click", () => {
    navigator.clipboard?.writeText(code).then(() => { copy.textContent = "copied"; }, () => {});
  });
  bar.append(name, copy);
  const pre = el("pre");
  const body = el("code");
  body.textContent = code;
  pre.append(body);
  block.append(bar, pre);
  return block;
}
