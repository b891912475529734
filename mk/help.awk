# `make help`: every "target: ## description" line of the Makefiles, names in one column as wide as
# the longest name (never cut), descriptions wrapped to the terminal's width (80 on a pipe).
# Variables: width (columns), color (1: names in cyan).
BEGIN { FS = ":.*## " }
/^[a-zA-Z0-9_-]+:.*## / {
    n++; name[n] = $1; desc[n] = $2
    if (length($1) > w) w = length($1)
}
function emit(i, text, first) {
    if (first) printf "  %s%-*s%s  %s\n", c1, w, name[i], c0, text
    else printf "%*s%s\n", w + 4, "", text
}
END {
    if (color == 1) { c1 = "\033[36m"; c0 = "\033[0m" }
    avail = width - (w + 4); if (avail < 30) avail = 30
    for (i = 1; i <= n; i++) {
        nw = split(desc[i], words, " "); line = ""; first = 1
        for (j = 1; j <= nw; j++) {
            if (line == "") line = words[j]
            else if (length(line) + 1 + length(words[j]) <= avail) line = line " " words[j]
            else { emit(i, line, first); first = 0; line = words[j] }
        }
        emit(i, line, first)
    }
}
