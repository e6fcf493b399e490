// A list's "select every row" box ticks or clears the row boxes of its table (the page works without it).
document.addEventListener("change", function (event) {
  var all = event.target.closest("input.select-all");
  if (!all) { return; }
  all.closest("table").querySelectorAll("tbody input[type=checkbox]").forEach(function (box) {
    box.checked = all.checked;
  });
});
