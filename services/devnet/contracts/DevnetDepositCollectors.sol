// SPDX-License-Identifier: MIT
// DEVNET STAND-IN. Not for production use.
//
// x402-fleet's own deposit collectors for the devnet batch-settlement contract, written from the
// collectorData encodings, EIP-712 types and addresses shipped in @x402/evm (batch-settlement):
//   - DevnetERC3009DepositCollector at 0x4020806089470a89826cB9fB1f4059150b550004:
//     collectorData = abi.encode(uint256 validAfter, uint256 validBefore, uint256 salt, bytes signature);
//     the payer signed ReceiveWithAuthorization(from=payer, to=this collector, value=amount, ...,
//     nonce = keccak256(abi.encode(channelId, salt))) on the token.
//   - DevnetPermit2DepositCollector at 0x4020425FAf3B746C082C2f942b4E5159887B0005:
//     collectorData = abi.encode(uint256 nonce, uint256 deadline, bytes permit2Signature,
//     bytes eip2612PermitData) where eip2612PermitData is empty or
//     abi.encode(uint256 value, uint256 deadline, uint8 v, bytes32 r, bytes32 s); the payer signed a
//     Permit2 PermitWitnessTransferFrom with spender = this collector and the witness
//     DepositWitness(bytes32 channelId).
// Both move the funds straight to the batch-settlement contract and only that contract may call
// them (the deposit is credited there, after it has checked that exactly `amount` arrived).
// No constructor runs at the canonical addresses: everything is a constant. Seen from outside they
// behave as the deployed collectors: the same getters, errors, events and order of checks.
pragma solidity ^0.8.28;

import {ISignatureTransfer, IERC20PermitVRS} from "./DevnetExactPermit2Proxy.sol";
import {DevnetEscrowBase, IDevnetDepositCollector} from "./DevnetBatchSettlement.sol";

interface IERC3009Receive {
    function receiveWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes memory signature
    ) external;
}

/// Common part of both collectors: the caller restriction.
abstract contract DevnetDepositCollectorBase is DevnetEscrowBase, IDevnetDepositCollector {
    error OnlyX402BatchSettlement();
    error InvalidX402BatchSettlementAddress();

    address public constant x402BatchSettlement = 0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003;

    modifier onlyBatchSettlement() {
        if (msg.sender != x402BatchSettlement) revert OnlyX402BatchSettlement();
        _;
    }
}

contract DevnetERC3009DepositCollector is DevnetDepositCollectorBase {
    function collect(address payer, address token, uint256 amount, bytes32 channelId, bytes calldata collectorData)
        external
        onlyBatchSettlement
    {
        (uint256 validAfter, uint256 validBefore, uint256 salt, bytes memory signature) =
            abi.decode(collectorData, (uint256, uint256, uint256, bytes));
        bytes32 nonce = keccak256(abi.encode(channelId, salt));
        // The token enforces to == msg.sender (this collector), the time window, the nonce and the signature.
        IERC3009Receive(token).receiveWithAuthorization(payer, address(this), amount, validAfter, validBefore, nonce, signature);
        _safeTransfer(token, x402BatchSettlement, amount);
    }
}

contract DevnetPermit2DepositCollector is DevnetDepositCollectorBase {
    error Permit2612AmountMismatch();
    error InvalidPermit2Address();

    /// A failing EIP-2612 permit is logged (it may have been front-run) and the Permit2 transfer decides.
    event EIP2612PermitFailedWithReason(address indexed token, address indexed owner, string reason);
    event EIP2612PermitFailedWithPanic(address indexed token, address indexed owner, uint256 errorCode);
    event EIP2612PermitFailedWithData(address indexed token, address indexed owner, bytes data);

    ISignatureTransfer public constant PERMIT2 = ISignatureTransfer(0x000000000022D473030F116dDEE9F6B43aC78BA3);
    bytes32 public constant DEPOSIT_WITNESS_TYPEHASH = keccak256("DepositWitness(bytes32 channelId)");
    string public constant DEPOSIT_WITNESS_TYPE_STRING =
        "DepositWitness witness)DepositWitness(bytes32 channelId)TokenPermissions(address token,uint256 amount)";

    function collect(address payer, address token, uint256 amount, bytes32 channelId, bytes calldata collectorData)
        external
        onlyBatchSettlement
    {
        (uint256 nonce, uint256 deadline, bytes memory signature, bytes memory eip2612PermitData) =
            abi.decode(collectorData, (uint256, uint256, bytes, bytes));
        if (eip2612PermitData.length != 0) _tryPermit(payer, token, amount, eip2612PermitData);
        _pull(payer, token, amount, channelId, nonce, deadline, signature);
    }

    /// Submits the payer's EIP-2612 permit granting Permit2 the allowance. A failing permit is
    /// logged, by the shape of its revert, and otherwise ignored; the Permit2 transfer then decides.
    function _tryPermit(address payer, address token, uint256 amount, bytes memory data) private {
        (uint256 value, uint256 deadline, uint8 v, bytes32 r, bytes32 s) =
            abi.decode(data, (uint256, uint256, uint8, bytes32, bytes32));
        if (value != amount) revert Permit2612AmountMismatch();
        (bool ok, bytes memory ret) = token.call(abi.encodeCall(IERC20PermitVRS.permit, (payer, address(PERMIT2), value, deadline, v, r, s)));
        if (ok) return;
        bytes4 selector = ret.length >= 4 ? bytes4(ret) : bytes4(0);
        if (selector == 0x08c379a0 && ret.length >= 68) {
            emit EIP2612PermitFailedWithReason(token, payer, abi.decode(_tail(ret), (string)));
        } else if (selector == 0x4e487b71 && ret.length == 36) {
            emit EIP2612PermitFailedWithPanic(token, payer, abi.decode(_tail(ret), (uint256)));
        } else {
            emit EIP2612PermitFailedWithData(token, payer, ret);
        }
    }

    /// The revert data after its 4-byte selector.
    function _tail(bytes memory ret) private pure returns (bytes memory tail) {
        tail = new bytes(ret.length - 4);
        for (uint256 i = 0; i < tail.length; ++i) tail[i] = ret[i + 4];
    }

    function _pull(
        address payer,
        address token,
        uint256 amount,
        bytes32 channelId,
        uint256 nonce,
        uint256 deadline,
        bytes memory signature
    ) private {
        if (address(PERMIT2).code.length == 0) revert InvalidPermit2Address();
        PERMIT2.permitWitnessTransferFrom(
            ISignatureTransfer.PermitTransferFrom({
                permitted: ISignatureTransfer.TokenPermissions({token: token, amount: amount}),
                nonce: nonce,
                deadline: deadline
            }),
            ISignatureTransfer.SignatureTransferDetails({to: x402BatchSettlement, requestedAmount: amount}),
            payer,
            keccak256(abi.encode(DEPOSIT_WITNESS_TYPEHASH, channelId)),
            DEPOSIT_WITNESS_TYPE_STRING,
            signature
        );
    }
}
