// Ask before every action: forms with data-confirm (the page works without this script, unasked).
document.addEventListener("submit", function (event) {
  var form = event.target.closest("form[data-confirm]");
  if (form && !window.confirm(form.getAttribute("data-confirm"))) { event.preventDefault(); }
});
