// pymdownx.arithmatex (generic) wraps maths in \( \) and \[ \] inside elements of class "arithmatex";
// MathJax typesets only those. Loaded before docs/javascripts/mathjax/tex-svg.js (mkdocs.yml).
window.MathJax = {
  tex: { inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true, processEnvironments: true },
  options: { ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex" },
};
