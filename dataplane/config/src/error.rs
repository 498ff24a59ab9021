//! [`ConfigError`]: every failure to load a config, displayed as exactly one line that names
//! the file position or key path (`config error: ports[0].mac: invalid MAC "zz"`).

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why a configuration could not be loaded. `Display` is always a single line.
#[derive(Debug)]
pub enum ConfigError {
    /// The file could not be read.
    Io {
        /// The path given to [`crate::Config::load`].
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The text is not valid TOML.
    Syntax {
        /// 1-based line of the error, when known.
        line: Option<usize>,
        /// What the TOML parser said.
        message: String,
    },
    /// A key that the schema does not know (every table denies unknown keys).
    UnknownKey {
        /// The unknown key.
        key: String,
        /// Path of the table that holds it; empty for the top level.
        table: String,
        /// 1-based line, when known.
        line: Option<usize>,
    },
    /// A value of the wrong type or format, or one that fails validation.
    Invalid {
        /// Key path of the offending value (`ports[1].mtu`, `lcores.cores[0]`).
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

impl ConfigError {
    /// Builds an [`ConfigError::Invalid`].
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid { field: field.into(), message: message.into() }
    }

    /// The key path or table this error is about, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            ConfigError::UnknownKey { table, .. } => Some(table),
            _ => None,
        }
    }
}

/// Collapses whitespace runs (including newlines) so Display stays on one line.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("config error: ")?;
        match self {
            ConfigError::Io { path, source } => {
                write!(f, "cannot read {}: {}", path.display(), one_line(&source.to_string()))
            }
            ConfigError::Syntax { line, message } => match line {
                Some(l) => write!(f, "line {l}: {}", one_line(message)),
                None => f.write_str(&one_line(message)),
            },
            ConfigError::UnknownKey { key, table, line } => {
                write!(f, "unknown key '{}'", one_line(key))?;
                if table.is_empty() {
                    f.write_str(" at top level")?;
                } else {
                    write!(f, " in {}", one_line(table))?;
                }
                if let Some(l) = line {
                    write!(f, " (line {l})")?;
                }
                Ok(())
            }
            ConfigError::Invalid { field, message } => {
                write!(f, "{}: {}", one_line(field), one_line(message))
            }
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
