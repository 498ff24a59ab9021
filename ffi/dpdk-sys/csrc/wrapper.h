/* Headers bindgen reads. Keep this list to what pmrxe-port actually uses:
 * every extra header costs build time (rte_ethdev.h already drags in rte_flow). */
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_cycles.h>
#include <rte_log.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>
#include <rte_eth_ring.h>
#include <rte_dev.h>
#include <rte_bus_vdev.h>

#include "shim.h"
