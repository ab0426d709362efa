/*
 * doc: help text as text, Markdown or roff (man(7) macros).
 */
#include "src/cmd/doc.h"

#include <stdio.h>
#include <string.h>

DocFormat doc_format = DOC_TEXT;
int doc_nested = 0;
static int table_cols;

void doc_put(const char *s, int in_table) {
    int bol = 1; /* at the start of an output line */
    for (; *s; s++) {
        const char c = *s;
        if (doc_format == DOC_MAN) {
            if (bol && (c == ' ' || c == '\t')) continue; /* a leading space breaks the fill */
            if (bol && (c == '.' || c == '\'')) fputs("\\&", stdout);
            if (c == '`') continue; /* Markdown's code spans */
            if (c == '\\') fputs("\\e", stdout);
            else if (c == '-') fputs("\\-", stdout);
            else if (c == '|') fputs("|\\:", stdout); /* a line may break after a bar */
            else putchar(c);
        } else if (doc_format == DOC_MARKDOWN && in_table) {
            if (c == '|') fputs("\\|", stdout);
            else putchar(c == '\n' ? ' ' : c);
        } else {
            putchar(c);
        }
        bol = c == '\n';
    }
}

void doc_wrap(FILE *f, const char *text, int first_done, int indent, int width) {
    int col = first_done;
    const char *p = text;
    while (*p) {
        const size_t n = strcspn(p, " ");
        if (col > indent && col + 1 + (int)n > width) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent || (col == indent && p != text && col > first_done)) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", (int)n, p);
        col += (int)n;
        p += n;
        while (*p == ' ') p++;
    }
    fputc('\n', f);
}

void doc_section(const char *title) {
    if (doc_format == DOC_MAN) {
        fputs(doc_nested ? ".SS " : ".SH ", stdout);
        doc_put(title, 0);
        putchar('\n');
    } else if (doc_format == DOC_MARKDOWN) {
        /* a command's own parts are paragraphs of its section */
        if (strcmp(title, "DESCRIPTION") == 0) return;
        if (strcmp(title, "OPTIONS") == 0) {
            printf("Options:\n\n");
            return;
        }
        printf("#### ");
        doc_put(title, 0);
        printf("\n\n");
    }
}

void doc_usage(const char *usage) {
    switch (doc_format) {
    case DOC_TEXT: printf("usage: %s\n", usage); break;
    case DOC_MARKDOWN: printf("```\n%s\n```\n\n", usage); break;
    case DOC_MAN:
        if (!doc_nested) puts(".SH SYNOPSIS");
        puts(".nf");
        doc_put(usage, 0);
        puts("\n.fi");
        break;
    }
}

/* Each paragraph of text (parted by blank lines), for man and Markdown. */
void doc_para(const char *text) {
    if (doc_format == DOC_TEXT) {
        printf("%s\n", text);
        return;
    }
    const char *p = text;
    while (*p) {
        const char *end = strstr(p, "\n\n");
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        char buf[4096];
        snprintf(buf, sizeof buf, "%.*s", (int)n, p);
        if (buf[0]) {
            if (doc_format == DOC_MAN) puts(".PP");
            doc_put(buf, 0);
            printf(doc_format == DOC_MAN ? "\n" : "\n\n");
        }
        p += n;
        while (*p == '\n') p++;
    }
}

void doc_option(const char *flag, const char *meta, const char *note, const char *help) {
    if (doc_format == DOC_MARKDOWN) {
        printf("- `%s%s%s`", flag, meta ? " " : "", meta ? meta : "");
        if (note) printf(" (%s)", note);
        printf(": %s\n", help);
    } else if (doc_format == DOC_MAN) {
        puts(".TP");
        fputs("\\fB", stdout);
        doc_put(flag, 0);
        fputs("\\fR", stdout);
        if (meta) {
            fputs(" \\fI", stdout);
            doc_put(meta, 0);
            fputs("\\fR", stdout);
        }
        if (note) {
            fputs(" (", stdout);
            doc_put(note, 0);
            fputs(")", stdout);
        }
        putchar('\n');
        doc_put(help, 0);
        putchar('\n');
    }
}

void doc_table(int n, const char *const *head) {
    table_cols = n;
    if (doc_format != DOC_MARKDOWN) return;
    for (int i = 0; i < n; i++) {
        printf("| ");
        doc_put(head[i], 1);
        printf(" ");
    }
    printf("|\n");
    for (int i = 0; i < n; i++) printf("|---");
    printf("|\n");
}

void doc_row(const char *const *cells) {
    if (doc_format == DOC_MARKDOWN) {
        for (int i = 0; i < table_cols; i++) {
            printf("| ");
            doc_put(cells[i], 1);
            printf(" ");
        }
        printf("|\n");
    } else if (doc_format == DOC_MAN) {
        puts(".TP");
        fputs("\\fB", stdout);
        doc_put(cells[0], 0);
        fputs("\\fR\n", stdout);
        for (int i = 1; i < table_cols; i++) {
            if (!cells[i][0]) continue;
            doc_put(cells[i], 0);
            putchar('\n');
        }
    } else {
        printf("  %-26s", cells[0]);
        for (int i = 1; i < table_cols; i++) printf(" %s", cells[i]);
        putchar('\n');
    }
}

void doc_table_end(void) {
    if (doc_format == DOC_MARKDOWN) putchar('\n');
    table_cols = 0;
}
