/**
 * Flannel's Node annotations for a VXLAN node, so tools that read flannel's annotations see Atoll's VTEPs. Pure.
 */
export const FLANNEL_ANNOTATION_PREFIX = 'flannel.alpha.coreos.com';

export function flannelAnnotations(vni: number, vtepMac: string, publicIp: string): Record<string, string> {
  return {
    [`${FLANNEL_ANNOTATION_PREFIX}/backend-type`]: 'vxlan',
    [`${FLANNEL_ANNOTATION_PREFIX}/backend-data`]: JSON.stringify({ VNI: vni, VtepMAC: vtepMac }),
    [`${FLANNEL_ANNOTATION_PREFIX}/public-ip`]: publicIp,
  };
}
