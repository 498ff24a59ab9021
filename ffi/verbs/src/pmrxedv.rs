//! pmrxedv (TODO)
