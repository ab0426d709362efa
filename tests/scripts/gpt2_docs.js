// The documents of a text as `modtrain prep --doc-sep SEP` cuts them: the
// pieces between lines equal to SEP (a line's newline stays with it),
// empty ones left out. For the reference test and the benchmark.
module.exports = function splitDocs(text, sep) {
    const docs = [];
    for (let start = 0, at = 0;;) {
        const nl = text.indexOf("\n", at), end = nl < 0 ? text.length : nl;
        const isSep = text.slice(at, end) === sep;
        if (isSep || end >= text.length) {
            const stop = isSep ? at : text.length;
            if (stop > start) docs.push(text.slice(start, stop));
            start = isSep ? (nl < 0 ? text.length : end + 1) : text.length;
        }
        if (nl < 0) break;
        at = end + 1;
    }
    return docs;
};
