/*
 * doc: what --help prints, in the format asked for. The same calls make a
 * command's --help (text), its part of docs/reference.md (Markdown) and
 * its man page (roff), so the three say one thing: `modtrain reference`
 * sets the format and asks each command for its --help.
 */
#ifndef MODTRAIN_DOC_H
#define MODTRAIN_DOC_H

#include <stdio.h>

typedef enum { DOC_TEXT = 0, DOC_MARKDOWN = 1, DOC_MAN = 2 } DocFormat;

/* The format of what follows (DOC_TEXT unless `modtrain reference` runs),
 * and whether a command's help is a part of another's page (a ckpt
 * subcommand's: no sections of its own). */
extern DocFormat doc_format;
extern int doc_nested;

/* A section (man .SH, Markdown "####"); nothing in text. */
void doc_section(const char *title);
/* The usage lines, verbatim (text: "usage: ..."). */
void doc_usage(const char *usage);
/* Paragraphs: blank lines part them; single line breaks are spaces in
 * Markdown and man, kept in text. */
void doc_para(const char *text);
/* An option or key: flag (with its dashes), its value's name (NULL:
 * none), a note (the default, NULL: none) and what it does. Markdown and
 * man only: text's layouts are the callers'. */
void doc_option(const char *flag, const char *meta, const char *note, const char *help);
/* A table of n columns (Markdown), each row an item in man whose first
 * cell is the term. */
void doc_table(int n, const char *const *head);
void doc_row(const char *const *cells);
void doc_table_end(void);
/* text filled to lines of at most width columns, each after indent spaces
 * (the first after first_done columns already printed), to f. */
void doc_wrap(FILE *f, const char *text, int first_done, int indent, int width);
/* text escaped for the format: man's backslashes, dashes and leading
 * dots; Markdown table cells' bars (in_table). */
void doc_put(const char *text, int in_table);

#endif
