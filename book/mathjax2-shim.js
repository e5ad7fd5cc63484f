// The ipywidgets embed bundle typesets widget labels with MathJax 2's API (MathJax.Hub.Queue); the book ships
// MathJax 3. This maps the one call it makes onto MathJax 3, so widget labels neither break nor log errors.
(function () {
  function typeset(args) {
    var mj = window.MathJax;
    var el = args && args[2];
    if (mj && mj.typesetPromise && el) { mj.typesetPromise([el]).catch(function () {}); }
  }
  function install() {
    if (window.MathJax && !window.MathJax.Hub) { window.MathJax.Hub = { Queue: typeset }; }
  }
  install();
  document.addEventListener("DOMContentLoaded", install);
  window.addEventListener("load", install);
})();
